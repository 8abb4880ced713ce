"""tb_plugin: the mltrace tab of TensorBoard, its routes, frontend and browser tests."""
