"""mltrace.storage: local and S3 storage and what each can do."""
