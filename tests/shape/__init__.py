"""The code's shape: size limits, import contracts and the import paths users were shown."""
