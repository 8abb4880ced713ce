"""smdebug's two trial classes, ``LocalTrial`` and ``S3Trial``, with smdebug's signatures:
``create_trial`` returns one or the other, and code that builds them by name or checks
``isinstance`` keeps working. All their behaviour is Trial's. Import them from mltrace.trials.
"""

from __future__ import annotations

from typing import Any

from mltrace.exceptions import MltraceValueError
from mltrace.storage import is_remote
from mltrace.trials.trial import Trial


class LocalTrial(Trial):
    """A trial in a local directory: smdebug's ``LocalTrial``, its signature included
    (``create_trial`` returns one for a local path).

    Args:
        name: a display name.
        dirname: the trial directory (``~`` expanded).
        range_steps, parallel, check, index_mode, cache: as Trial (smdebug's arguments).
        **kwargs: Trial's other keyword arguments (``timeout``, ``poll_interval``).

    Raises:
        MltraceValueError: ``dirname`` is a URI (open it with create_trial).
    """

    def __init__(self, name: str | None, dirname: str,
                 range_steps: tuple[int | None, int | None] | None = None,
                 parallel: bool = True, check: bool = False, index_mode: bool = True,
                 cache: bool = False, **kwargs: Any) -> None:
        if not isinstance(dirname, str) or is_remote(dirname):
            raise MltraceValueError(
                f"LocalTrial(dirname={dirname!r}) takes a local directory; open a URI with "
                "create_trial(uri) (S3Trial for s3://)")
        super().__init__(dirname, name=name, range_steps=range_steps, parallel=parallel,
                         check=check, index_mode=index_mode, cache=cache, **kwargs)
        #: smdebug's attribute: the trial directory.
        self.trial_dir = self.path


class S3Trial(Trial):
    """A trial under an S3 prefix: smdebug's ``S3Trial``, its signature included
    (``create_trial`` returns one for an ``s3://`` URI).

    Args:
        name: a display name.
        bucket_name: the bucket.
        prefix_name: the prefix (the hook's out_dir without ``s3://bucket/``).
        range_steps, check, index_mode, cache: as Trial (smdebug's arguments).
        **kwargs: Trial's other keyword arguments (``timeout``, ``poll_interval``, ``parallel``).
    """

    def __init__(self, name: str | None, bucket_name: str, prefix_name: str,
                 range_steps: tuple[int | None, int | None] | None = None,
                 check: bool = False, index_mode: bool = True, cache: bool = False,
                 **kwargs: Any) -> None:
        if not isinstance(bucket_name, str) or not bucket_name or "/" in bucket_name:
            raise MltraceValueError(
                f"S3Trial(bucket_name={bucket_name!r}) takes a bucket name, e.g. "
                "S3Trial('run', 'my-bucket', 'jobs/run1'), or use create_trial('s3://...')")
        #: smdebug's attributes: the bucket, and the prefix ending with "/".
        self.bucket_name = bucket_name
        self.prefix_name = str(prefix_name).rstrip("/") + "/"
        super().__init__(f"s3://{bucket_name}/{prefix_name}", name=name,
                         range_steps=range_steps, check=check, index_mode=index_mode,
                         cache=cache, **kwargs)
