"""mltrace.writer: the trial writer, its queue, its process and the TensorBoard export."""
