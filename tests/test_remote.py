"""Remote transfer: S3 through boto3 against a real HTTP endpoint (moto's server on loopback),
and a user's own module.function. (An endpoint that goes down and comes back mid-run:
test_reliability.py.)"""

from __future__ import annotations

import boto3
import pytest
from conftest import free_port, run_phalanx

from phalanx.visualize import LocalSource, S3Source

SECRET = "phalanx-test-secret-9f3b2c"  # must never show up in output or in written files
BUCKET = "phalanx-test"


@pytest.fixture
def s3(monkeypatch):
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    creds = {
        "AWS_ACCESS_KEY_ID": "phalanx-test-key",
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    for key, value in creds.items():
        monkeypatch.setenv(key, value)
    url = f"http://127.0.0.1:{port}"
    client = boto3.client("s3", endpoint_url=url)
    client.create_bucket(Bucket=BUCKET)
    yield server, url, client
    server.stop()


def keys(client, prefix):
    return sorted(o["Key"] for o in client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", []))


def body(client, key):
    return client.get_object(Bucket=BUCKET, Key=key)["Body"].read()


@pytest.mark.slow
def test_ddp_run_uploads_snapshots_and_checkpoints_and_visualize_reads_them(tmp_path, s3, visdom_server):
    _, url, client = s3
    result = run_phalanx(
        "trainlaunch",
        "--epochs",
        2,
        "--checkpoints-dir",
        tmp_path,
        "--no-progress",
        "--remote-transfer",
        f"s3://{BUCKET}/runs",
        "--s3-endpoint-url",
        url,
        "--use-torchrun",
        "--nproc_per_node 2",
    )
    assert result.code == 0, result.err
    run = tmp_path / "experiment"
    assert keys(client, "runs/") == [
        "runs/experiment/best.pt",
        "runs/experiment/latest.pt",
        "runs/experiment/pickle/segment_000001.pkl",
    ]
    assert body(client, "runs/experiment/latest.pt") == (run / "latest.pt").read_bytes()
    local = LocalSource(run / "pickle").history(warn=False)
    remote = S3Source(f"s3://{BUCKET}/runs/experiment/pickle", url).history(warn=False)
    assert remote == local and len(local.records) > 5
    shown = run_phalanx(
        "visualize",
        "--once",
        "--pickle_dir",
        f"s3://{BUCKET}/runs/experiment/pickle",
        "--s3-endpoint-url",
        url,
        "--port",
        visdom_server,
        "--env",
        "from-s3",
    )
    assert shown.code == 0, shown.err
    from test_visualize import assert_visdom_equals_history

    assert_visdom_equals_history(visdom_server, "from-s3", local)
    # Credentials come from the standard chain and are never written or printed.
    written = b"".join(p.read_bytes() for p in run.rglob("*") if p.is_file())
    assert SECRET.encode() not in written
    assert SECRET not in result.out + result.err + shown.out + shown.err


def test_remote_transfer_cmd_receives_every_written_path(tmp_path, phalanx, monkeypatch):
    package = tmp_path / "userpkg" / "storage"
    package.mkdir(parents=True)
    (tmp_path / "userpkg" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    log = tmp_path / "received.txt"
    (package / "mirror.py").write_text(
        f"def save(path):\n    with open({str(log)!r}, 'a') as fh:\n        fh.write(path + '\\n')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    result = phalanx(
        "train",
        "--epochs",
        3,
        "--save-epoch-freq",
        1,
        "--checkpoints-dir",
        tmp_path / "ck",
        "--remote-transfer-cmd",
        "userpkg.storage.mirror.save",
    )
    assert result.code == 0, result.err
    run = tmp_path / "ck" / "experiment"
    written = {str(p) for p in run.glob("*.pt")} | {str(p) for p in (run / "pickle").glob("*.pkl")}
    received = set(log.read_text().split())
    assert received == written
    assert {"latest.pt", "best.pt", "epoch_0001.pt", "epoch_0003.pt"} <= {p.rsplit("/", 1)[1] for p in received}
