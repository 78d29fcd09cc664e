"""``python -m ctlwire.conformance``: the harness's command line
(:func:`ctlwire.conformance.main`)."""

from __future__ import annotations

import os

from ctlwire.conformance import main

os.environ.setdefault("PYTHONUNBUFFERED", "1")
raise SystemExit(main())
