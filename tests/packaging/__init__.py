"""The installable package: the wheel and the sdist, installed into a fresh virtual environment."""
