"""``create_trial``: open a trial by its location, as smdebug's function does (a LocalTrial for a
path, an S3Trial for ``s3://``)."""

from __future__ import annotations

from typing import Any

from mltrace.exceptions import MltraceValueError
from mltrace.storage.s3 import parse_s3_uri
from mltrace.trials.kinds import LocalTrial, S3Trial
from mltrace.trials.trial import Trial, trial_keywords, unknown_keywords


def create_trial(path: str | None = None, name: str | None = None, *,
                 out_dir: str | None = None, profiler: bool = False,
                 output_dir: str | None = None, **kwargs: Any) -> Trial:
    """Open the trial at ``path`` (or ``out_dir=``), a hook's output directory.

    Args:
        path: the trial's location (local path or URI), as smdebug's first argument.
        name: a display name (default: the last path component).
        out_dir: the same as ``path``, by the hook's name for it.
        profiler: smdebug's argument for its profiler trials; mltrace writes no profiler data,
            so only False is accepted.
        output_dir: smdebug's argument (where its profiler trials wrote reports); no effect.
        **kwargs: Trial's keyword arguments (``range_steps``, ``timeout``, ``poll_interval``, and
            smdebug's ``check``, ``index_mode``, ``cache``, ``parallel``).

    Raises:
        MltraceValueError: no location given, or ``profiler=True``.
        MltraceTypeError: an unknown keyword argument (the message lists the valid ones).

    Example:
        >>> trial = create_trial("/tmp/run")
        >>> trial.tensor("gradient/Net_fc1.weight").values()
    """
    if kwargs:
        valid = [*trial_keywords(), "out_dir", "profiler", "output_dir"]
        unknown = {k: v for k, v in kwargs.items() if k not in valid}
        if unknown:
            raise unknown_keywords("create_trial", unknown, valid)
    if profiler:
        raise MltraceValueError(
            "create_trial(profiler=True) opens smdebug's profiler trials; mltrace records no "
            "profiler data (use MLflow's system metrics): call create_trial(path)"
        )
    location = path if path is not None else out_dir
    if location is None:
        raise MltraceValueError(
            "create_trial needs the trial's path: create_trial('/path/to/out_dir')")
    if isinstance(location, str):
        location = location.strip()
        scheme = location.split("://", 1)[0].lower() if "://" in location else "file"
        if scheme == "file":
            return LocalTrial(name, location, **kwargs)
        if scheme == "s3":
            parse_s3_uri(location)  # a clear error for s3:// without a bucket
            bucket, _, prefix = location[len("s3://"):].partition("/")
            return S3Trial(name, bucket, prefix, **kwargs)
    return Trial(location, name=name, **kwargs)
