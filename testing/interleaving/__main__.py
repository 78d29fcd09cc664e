"""``python -m ctlwire.testing.interleaving [MAX_CALLERS [MAX_CALLERS_TWO_RANKS]]``."""

from __future__ import annotations

from ctlwire.testing.interleaving._explorer import main

raise SystemExit(main())
