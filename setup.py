"""The packages of the mltrace distribution (the rest of its metadata is in setup.cfg).

The TensorBoard tab and the MLflow plugin live in the repository's folders tb_plugin/ and
mlflow_plugin/ and install as the packages ``mltrace_tb`` and ``mltrace_mlflow``: names of
their own, so they never clash with another distribution's generic "tb_plugin". setup.cfg cannot
map folders to other names next to ``find:``, hence this file.
"""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["mltrace", "mltrace.*"]), "mltrace_tb", "mltrace_mlflow"],
    package_dir={"mltrace_tb": "tb_plugin", "mltrace_mlflow": "mlflow_plugin"},
)
