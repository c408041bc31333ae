"""The operator console: a server-rendered web page to see, answer and cancel tasks.

:func:`ops_app` is an ASGI app over one store; ``keel serve`` mounts it at ``/ops`` (on
loopback) and ``keel ops --store URL`` serves it alone. See ``docs/ops.md``.
"""

from keel.ops.app import LOCAL_OPERATOR, MOUNT, ops_app, standalone_app

__all__ = ["LOCAL_OPERATOR", "MOUNT", "ops_app", "standalone_app"]
