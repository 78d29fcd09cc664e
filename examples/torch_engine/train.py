"""RL weight sync with a real model: a trainer pushes its weights to torch engine ranks.

    pip install 'ctlwire[torch]'
    python examples/torch_engine/train.py [--engines 3] [--cycles 5] [--backend trio]

The same as ``ctlwire demo --torch``; see :mod:`ctlwire.app.torch_demo`
for what each cycle does, and :mod:`ctlwire.app.torch_engine` for the
engine (a decoder-only transformer served by a poll loop) and its methods.
"""

from __future__ import annotations

import sys

from ctlwire.app.torch_demo import main

if __name__ == "__main__":
    sys.exit(main())
