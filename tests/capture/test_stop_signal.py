"""The stop-signal check never turns the hook off: a store that does not answer when it looks
(S3 down) or a damaged signal file means "no signal now", and the next look reads it."""

from __future__ import annotations

from pathlib import Path

from mltrace.capture.stop import StopSignal
from mltrace.exceptions import MltraceRuntimeError
from mltrace.format import paths
from mltrace.storage.local import LocalStorage


class FlakyStore(LocalStorage):
    """A local directory that fails as an unreachable S3 endpoint does while ``down``."""

    down = False

    def exists(self, key: str) -> bool:
        if self.down:
            raise MltraceRuntimeError(f"cannot check {key}: S3 endpoint is unreachable")
        return super().exists(key)

    def read(self, key: str, start: int = 0, length: int | None = None) -> bytes:
        if self.down:
            raise MltraceRuntimeError(f"cannot read {key}: S3 endpoint is unreachable")
        return super().read(key, start, length)


def test_an_unreachable_store_or_a_damaged_signal_is_looked_at_again(tmp_path: Path) -> None:
    store = FlakyStore(str(tmp_path))
    signal = StopSignal(store, interval=0.0)
    store.write(paths.STOP_SIGNAL_FILE, b'{"rule": "LossNotDecreasing", "step": 7}')
    store.down = True
    assert signal.poll() is False and signal.requested is None
    store.down = False
    store.write(paths.STOP_SIGNAL_FILE, b"{not json")
    assert signal.poll() is False
    store.write(paths.STOP_SIGNAL_FILE, b'{"rule": "LossNotDecreasing", "step": 7}')
    assert signal.poll() is True
    assert signal.requested == {"rule": "LossNotDecreasing", "step": 7}
