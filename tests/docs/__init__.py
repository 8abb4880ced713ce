"""The documentation: README's commands run, the API reference covers every public name."""
