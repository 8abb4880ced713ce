"""mltrace_tb: the mltrace tab of TensorBoard, its routes, frontend and browser tests."""
