"""ctlwire inside other serving stacks: drop-in replacements built on ctlwire's
primitives (:mod:`ctlwire.kernel.primitives`). Each module follows one stack's
interface and names the release it matches; none imports the stack itself.

* :mod:`ctlwire.integrations.sglang` -- SGLang's ``FanOutCommunicator``.
"""
