"""Flight recorder record files for the TensorBoard tests, written as a hook's recorder writes
them (``FlightRecord.to_json`` under ``mltrace_flight_recorder/``): two workers, three dumps."""

from __future__ import annotations

from mltrace.format.flight_record import Dump, FirstNonFinite, FlightRecord, record_key
from mltrace.storage import open_storage

#: what the recorder tests keep of each tensor: more than the default min and max, so that the
#: recorder's copies (mltrace.pytorch.copy_ring) and several reductions per tensor are exercised
FIVE_REDUCTIONS = ("min", "max", "mean", "std", "l2")

POISONED = "Net_relu2_output_0"


def write_records(trial: str) -> FirstNonFinite:
    """Two workers' records: worker_1 saw the first non-finite tensor a step before worker_0."""
    first = FirstNonFinite(tensor=POISONED, step=12, mode="TRAIN", mode_step=12, worker="worker_1",
                           phase="forward", position=4, nonfinite_tensors=[POISONED, "Net_fc3_output_0"])
    late = FirstNonFinite(tensor="Net_fc3_output_0", step=13, mode="TRAIN", mode_step=13,
                          worker="worker_0", phase="forward", position=5)
    storage = open_storage(trial)
    storage.write(record_key("worker_1"), FlightRecord("worker_1", [Dump(
        trigger="nonfinite", reason=f"NaN in {POISONED}", step=12, mode="TRAIN", mode_step=12,
        time=1_700_000_100.0, steps_before=list(range(2, 12)), steps_after=[13, 14, 15],
        first_nonfinite=first)], first).to_json())
    storage.write(record_key("worker_0"), FlightRecord("worker_0", [
        Dump(trigger="manual", reason="requested with mltrace dump", step=5, mode="TRAIN",
             mode_step=5, time=1_700_000_000.0, steps_before=[1, 3, 5]),
        Dump(trigger="nonfinite", reason="NaN in Net_fc3_output_0", step=13, mode="TRAIN",
             mode_step=13, time=1_700_000_101.0, steps_before=list(range(400)), first_nonfinite=late),
    ], late).to_json())
    return first
