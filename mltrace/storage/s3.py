"""S3 storage through boto3 (imported lazily): the same interface as a local directory.

Endpoint, region and credentials come from the standard AWS environment and config files
(AWS_ENDPOINT_URL, AWS_PROFILE, ~/.aws/...), so the same code serves AWS and S3-compatible
servers. Writes are one PUT per file (multipart above ``multipart_threshold``); reads are ranged
GETs; listings use ListObjectsV2 with StartAfter so that a live reader only lists what is new.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from mltrace.exceptions import MltraceRuntimeError, MltraceValueError
from mltrace.storage.base import Storage

logger = logging.getLogger(__name__)

_AUTH_ERRORS = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "ExpiredToken",
                "InvalidToken", "AuthorizationHeaderMalformed", "403", "Forbidden"}


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """(bucket, prefix without slashes at either end) of ``s3://bucket/prefix``."""
    if not uri.lower().startswith("s3://"):
        raise MltraceValueError(f"{uri!r} is not an s3:// URI")
    rest = uri[5:]
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise MltraceValueError(f"{uri!r} has no bucket: use s3://bucket/prefix")
    return bucket, "/".join(p for p in prefix.split("/") if p)


class S3Storage(Storage):
    """A trial under an S3 prefix.

    Args:
        uri: ``s3://bucket/prefix``.
        client: a boto3 S3 client (default: one built from the environment).
        multipart_threshold: files above this size are uploaded in parts.
        max_workers: parallel requests for read_many.
        connect_timeout, read_timeout, max_attempts: botocore settings; writes fail fast so that
            the writer can spill to disk during an outage instead of stalling.
    """

    def __init__(self, uri: str, client: Any = None, multipart_threshold: int = 16 * 1024 * 1024,
                 max_workers: int = 16, connect_timeout: float = 3.0, read_timeout: float = 20.0,
                 max_attempts: int = 3) -> None:
        self.uri = uri.rstrip("/")
        self.bucket, self.prefix = parse_s3_uri(uri)
        self.multipart_threshold = multipart_threshold
        self.max_workers = max_workers
        self._client = client
        self._config = dict(connect_timeout=connect_timeout, read_timeout=read_timeout,
                            max_attempts=max_attempts)
        self._pool: ThreadPoolExecutor | None = None

    # -- plumbing -------------------------------------------------------------------------------
    @property
    def client(self) -> Any:
        """The boto3 client, created on first use."""
        if self._client is None:
            try:
                import boto3
                from botocore.config import Config
            except ImportError:
                raise MltraceValueError("s3:// locations need boto3: pip install 'mltrace[s3]'") from None
            config = Config(connect_timeout=self._config["connect_timeout"],
                            read_timeout=self._config["read_timeout"],
                            retries={"max_attempts": self._config["max_attempts"], "mode": "standard"},
                            max_pool_connections=max(10, self.max_workers))
            # A session of our own reads the environment now (the default session caches it).
            self._client = boto3.session.Session().client("s3", config=config)
        return self._client

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _explain(self, exc: Exception, action: str, key: str) -> Exception:
        """A clear error for what boto3 raised, naming the location and the likely fix."""
        from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

        where = f"s3://{self.bucket}/{self._key(key)}"
        if isinstance(exc, NoCredentialsError):
            return MltraceRuntimeError(
                f"cannot {action} {where}: no AWS credentials found; set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY or AWS_PROFILE")
        if isinstance(exc, EndpointConnectionError):
            endpoint = getattr(self.client.meta, "endpoint_url", "?")
            return MltraceRuntimeError(
                f"cannot {action} {where}: S3 endpoint {endpoint} is unreachable ({exc}); check "
                "AWS_ENDPOINT_URL and that the server is running")
        if isinstance(exc, ClientError):
            code = exc.response.get("Error", {}).get("Code", "")
            if code in _AUTH_ERRORS:
                return MltraceRuntimeError(
                    f"cannot {action} {where}: the S3 server rejected the credentials ({code}); "
                    "check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_PROFILE and the "
                    "bucket's permissions")
            if code == "NoSuchBucket":
                return MltraceRuntimeError(
                    f"cannot {action} {where}: bucket {self.bucket!r} does not exist; create it first")
        return exc

    # -- Storage --------------------------------------------------------------------------------
    def write(self, key: str, data: bytes) -> None:
        try:
            if len(data) >= self.multipart_threshold:
                from boto3.s3.transfer import TransferConfig

                self.client.upload_fileobj(io.BytesIO(data), self.bucket, self._key(key),
                                           Config=TransferConfig(multipart_threshold=self.multipart_threshold))
            else:
                self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)
        except Exception as exc:
            raise self._explain(exc, "write", key) from exc

    def read(self, key: str, start: int = 0, length: int | None = None) -> bytes:
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": self._key(key)}
        if start or length is not None:
            end = "" if length is None else str(start + length - 1)
            kwargs["Range"] = f"bytes={start}-{end}"
        try:
            return self.client.get_object(**kwargs)["Body"].read()
        except Exception as exc:
            from botocore.exceptions import ClientError

            if isinstance(exc, ClientError) and exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                raise FileNotFoundError(f"s3://{self.bucket}/{self._key(key)}") from None
            raise self._explain(exc, "read", key) from exc

    def read_many(self, requests: Sequence[tuple[str, int, int | None]]) -> list[bytes]:
        if len(requests) < 2:
            return [self.read(*r) for r in requests]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.max_workers, thread_name_prefix="mltrace-s3")
        return list(self._pool.map(lambda r: self.read(*r), requests))

    def list(self, prefix: str, start_after: str | None = None) -> list[str]:
        base = self._key(prefix.strip("/")) + "/"
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": base}
        if start_after:
            kwargs["StartAfter"] = self._key(start_after)
        strip = len(self.prefix) + 1 if self.prefix else 0
        keys: list[str] = []
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(**kwargs):
                keys.extend(obj["Key"][strip:] for obj in page.get("Contents", []))
        except Exception as exc:
            raise self._explain(exc, "list", prefix) from exc
        return sorted(keys)

    def delete(self, key: str) -> None:
        try:  # S3 answers 204 for a key that does not exist too
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key))
        except Exception as exc:
            raise self._explain(exc, "delete", key) from exc

    def exists(self, key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(key))
            return True
        except Exception as exc:
            from botocore.exceptions import ClientError

            if isinstance(exc, ClientError) and exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise self._explain(exc, "check", key) from exc
