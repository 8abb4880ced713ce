"""Real smdebug 1.0.34's S3Trial reads what mltrace's PyTorch hook wrote to S3.

The S3 server is SeaweedFS on 127.0.0.1 (this venv's ``weed``, started by the ``s3_server`` fixture
of tests/conftest.py; it checks credentials). mltrace's hook writes a short run (TRAIN then EVAL) to
``s3://<bucket>/jobs/run``; smdebug's ``create_trial("s3://...")`` (boto3 with AWS_REGION,
AWS_ENDPOINT_URL honoured by boto3) must see the same tensor names, steps per mode, workers and
values as the process captured and as mltrace's own reader on the same prefix.

SeaweedFS 4.48 answers one listing smdebug sends (StartAfter equal to the prefix) with nothing;
tests/support/s3_compat.py rewrites that request to its S3 equivalent, and a test here checks that the
server still needs it.
"""

from __future__ import annotations

import uuid

import numpy as np
import pytest
import torch
from smdebug.core.modes import ModeKeys as SmdModeKeys
from smdebug.trials import create_trial as smd_create_trial

import mltrace.pytorch as mlsmd
from mltrace.trials import create_trial as ml_create_trial
from tests.support import s3_compat

SCHEDULE = [("TRAIN", 3), ("EVAL", 2)]


@pytest.fixture(scope="module")
def aws_env(s3_server, tmp_path_factory):
    """The standard AWS variables for both readers and the hook (module-wide, then restored)."""
    mp = pytest.MonkeyPatch()
    for key, value in (("AWS_ENDPOINT_URL", s3_server.endpoint),
                       ("AWS_ACCESS_KEY_ID", s3_server.access_key),
                       ("AWS_SECRET_ACCESS_KEY", s3_server.secret_key),
                       ("AWS_DEFAULT_REGION", "us-east-1"),
                       ("AWS_REGION", "us-east-1"),  # smdebug reads only this one
                       ("MLTRACE_SPILL_DIR", str(tmp_path_factory.mktemp("spill")))):
        mp.setenv(key, value)
    s3_compat.install()
    yield s3_server
    s3_compat.uninstall()
    mp.undo()


@pytest.fixture(scope="module")
def run(aws_env):
    """Train with mltrace's hook to S3; return (uri, {(mode, mode_step): {name: value}})."""
    bucket = f"smd{uuid.uuid4().hex[:10]}"
    aws_env.client().create_bucket(Bucket=bucket)
    uri = f"s3://{bucket}/jobs/run"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 2))
    loss_fn = torch.nn.MSELoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = mlsmd.Hook(out_dir=uri, save_config=mlsmd.SaveConfig(save_interval=1),
                      include_collections=["weights", "biases", "gradients", "losses"])
    hook.register_module(model)
    hook.register_loss(loss_fn)
    expected: dict[tuple[str, int], dict[str, np.ndarray]] = {}
    for mode, n in SCHEDULE:
        hook.set_mode(getattr(mlsmd.modes, mode))
        for mode_step in range(n):
            values = expected.setdefault((mode, mode_step), {})
            for pname, param in model.named_parameters():
                values[f"Sequential_{pname}"] = param.detach().clone().numpy()
            x, y = torch.randn(5, 4), torch.randn(5, 2)
            if mode == "TRAIN":
                opt.zero_grad()
                loss = loss_fn(model(x), y)
                loss.backward()
                for pname, param in model.named_parameters():
                    values[f"gradient/Sequential_{pname}"] = param.grad.detach().clone().numpy()
                opt.step()
            else:
                with torch.no_grad():
                    loss = loss_fn(model(x), y)
            values["MSELoss_output_0"] = loss.detach().clone().numpy()
    hook.close()
    return uri, expected


@pytest.fixture(scope="module")
def trials(run):
    uri = run[0]
    return smd_create_trial(uri), ml_create_trial(uri)


def test_smdebug_opens_an_s3_trial(run, trials):
    st, mt = trials
    assert type(st).__name__ == "S3Trial"
    assert st.path.startswith(run[0])
    assert st.workers() == mt.workers() == ["worker_0"]
    assert st.num_workers == mt.num_workers == 1
    assert st.loaded_all_steps and mt.loaded_all_steps


def test_same_names_and_steps(run, trials):
    expected = run[1]
    st, mt = trials
    names = sorted({n for values in expected.values() for n in values})
    assert st.tensor_names() == mt.tensor_names() == names
    assert st.steps() == mt.steps() == list(range(sum(n for _, n in SCHEDULE)))
    for mode, n in SCHEDULE:
        assert st.steps(mode=SmdModeKeys[mode]) == mt.steps(mode=mode) == list(range(n))
        for mode_step in range(n):
            want = sorted(expected[(mode, mode_step)])
            assert st.tensor_names(step=mode_step, mode=SmdModeKeys[mode]) == want
            assert mt.tensor_names(step=mode_step, mode=mode) == want


def test_same_values(run, trials):
    expected = run[1]
    st, mt = trials
    checked = 0
    for (mode, mode_step), values in expected.items():
        for name, want in values.items():
            got = st.tensor(name).value(mode_step, mode=SmdModeKeys[mode])
            assert got.dtype == want.dtype and got.shape == want.shape, (name, mode, mode_step)
            assert np.array_equal(got, want), (name, mode, mode_step)
            assert np.array_equal(mt.tensor(name).value(mode_step, mode=mode), want)
            checked += 1
    assert checked == 3 * 9 + 2 * 5  # TRAIN: 4 params, 4 gradients, loss; EVAL: params, loss


def test_the_seaweedfs_listing_shim_is_still_needed(run, aws_env):
    """smdebug's first index listing, sent without the shim: SeaweedFS 4.48 lists nothing. When
    this fails, the server was fixed: delete tests/support/s3_compat.py and its use here."""
    import boto3

    bucket, prefix = run[0][5:].split("/", 1)
    plain = boto3.session.Session().client("s3")
    index = f"{prefix}/index"
    listed = plain.list_objects_v2(Bucket=bucket, Prefix=index, StartAfter=index)
    assert listed.get("Contents", []) == []
    assert len(plain.list_objects_v2(Bucket=bucket, Prefix=index)["Contents"]) == 5


def test_s3_trial_classes_and_token_match_smdebugs(trials):
    """create_trial gives both readers their S3Trial, with the same bucket, prefix and
    last_index_token (the key in the bucket, as smdebug names it)."""
    st, mt = trials
    assert type(mt).__name__ == type(st).__name__ == "S3Trial"
    assert (mt.bucket_name, mt.prefix_name) == (st.bucket_name, st.prefix_name)
    assert mt.last_index_token == st.last_index_token
    assert mt.last_index_token.startswith("jobs/run/index/")
