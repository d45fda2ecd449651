"""Skip sending a Django signal when sending it can have no effect."""

import logging
import weakref


class SignalGate:
    """Does sending ``signal`` have any effect?

    True when a receiver other than Django's own logging receiver is
    connected, or when that receiver would log (the ``django.tasks`` logger is
    enabled for the level). Re-examined whenever the receiver list changes.
    """

    def __init__(self, signal, own_receiver):
        self.signal = signal
        self.own_receiver = own_receiver
        self.logger = logging.getLogger("django.tasks")
        self._seen = -1
        self._others = True

    def needed(self, level: int) -> bool:
        receivers = self.signal.receivers
        if len(receivers) != self._seen:
            self._seen = len(receivers)
            live = []
            for entry in receivers:
                ref = entry[1]
                target = ref() if isinstance(ref, weakref.ReferenceType) else ref
                if target is not None:
                    live.append(target)
            self._others = any(target is not self.own_receiver for target in live)
        return self._others or self.logger.isEnabledFor(level)
