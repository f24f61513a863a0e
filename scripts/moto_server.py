"""moto_server, the SQS emulator the tests and the soak run against, with one race closed.

moto's `Queue.delete_message` rebuilds the queue's message list without the queue's lock and
then assigns it: a `SendMessage` served by another thread between the two appends to the old
list, and the message is gone, though `SendMessage` answered with its id. Real SQS loses no
acknowledged message; an emulator that does makes a test of "nothing acknowledged is lost"
fail for the emulator's sake (tests/it/crash.rs did, about once in thirty runs). Here
`delete_message` holds the lock `add_message` already takes. Arguments as `python -m moto.server`.
"""

import sys

import moto.sqs.models as sqs_models
from moto.server import main

_delete_message = sqs_models.Queue.delete_message


def _delete_message_locked(self, receipt_handle):
    with self._messages_lock:
        return _delete_message(self, receipt_handle)


sqs_models.Queue.delete_message = _delete_message_locked

if __name__ == "__main__":
    main(sys.argv[1:])
