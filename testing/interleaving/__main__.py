"""``python -m ctlwire.kernel.testing.interleaving [MAX_CALLERS [MAX_CALLERS_TWO_RANKS]]``."""

from __future__ import annotations

from ctlwire.kernel.testing.interleaving._explorer import main

raise SystemExit(main())
