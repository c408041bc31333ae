"""The task state machine: the transition table as data, and one pure function per write.

Adapters do no reasoning of their own. Inside one transaction they read the task, call
the function here, and persist what it returns with a conditional ``UPDATE`` (status and
fence unchanged since the read). So every adapter refuses the same writes with the same
errors, and the rules are tested without a database.

Every function either raises a :mod:`keel.errors` error (and nothing is written) or
returns a :class:`Change`. They live by concern; this module gathers them under one name
(``from keel.model import transitions as tr``):

* :mod:`keel.model.machine`: the table (:data:`ALLOWED`), :class:`Change`, and the
  checks every write shares;
* :mod:`keel.model.creation`: :func:`new_task`, :func:`check_imported`, and the
  fingerprint of a create request (idempotency);
* :mod:`keel.model.input`: :func:`request_input`, :func:`provide_input`;
* :mod:`keel.model.leases`: :func:`claim`, :func:`renew`, :func:`release`, and the writes
  made under a lease;
* :mod:`keel.model.terminal`: :func:`complete`, :func:`fail`, :func:`cancel`;
* :mod:`keel.model.retries`: :func:`retry`, :func:`recover`, :func:`reclaim`.
"""

from keel.model.creation import check_imported, new_task, request_digest, same_request
from keel.model.input import provide_input, request_input
from keel.model.leases import check_step, claim, release, renew, set_status_message
from keel.model.machine import (
    ALLOWED,
    DECLINED,
    FAILURE_MESSAGE_CHARS,
    INTERNAL_ERROR,
    Change,
    can_move,
    check_error,
    failure_message,
)
from keel.model.retries import reclaim, recover, retry
from keel.model.terminal import cancel, complete, fail

__all__ = [
    "ALLOWED",
    "DECLINED",
    "FAILURE_MESSAGE_CHARS",
    "INTERNAL_ERROR",
    "Change",
    "can_move",
    "cancel",
    "check_error",
    "check_imported",
    "check_step",
    "claim",
    "complete",
    "fail",
    "failure_message",
    "new_task",
    "provide_input",
    "reclaim",
    "recover",
    "release",
    "renew",
    "request_digest",
    "request_input",
    "retry",
    "same_request",
    "set_status_message",
]
