"""The two-host harness without making hosts (``make test``): why it cannot, and the commands."""
import os
import shutil

import pytest
import twohost


def test_it_says_why_namespaces_cannot_be_made(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "root" in twohost.namespaces_unavailable()
    with pytest.raises(twohost.NoNamespaces, match="root"):
        twohost.TwoHosts().open()
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert "iproute2" in twohost.namespaces_unavailable()


def test_two_instances_have_different_names():
    a, b = twohost.TwoHosts(), twohost.TwoHosts()
    assert len(set(a.names + b.names)) == 4
    assert all(str(os.getpid()) in n and n.startswith(twohost.PREFIX) for n in a.names)


def test_the_torchrun_commands_of_both_forms():
    static = twohost.torchrun_argv(1, ["ring", "--seq", "64"], port=29611)
    assert static[1:3] == ["-m", "torch.distributed.run"] and static[-4:] == ["lesson10.run", "ring",
                                                                            "--seq", "64"]
    joined = " ".join(static)
    assert "--nnodes 2 --nproc-per-node 2 --node-rank 1 --master-addr 10.77.0.1 --master-port 29611" in joined
    c10d = " ".join(twohost.torchrun_argv(0, ["ring"], port=29611, rdzv="c10d"))
    assert "--rdzv-backend c10d --rdzv-endpoint 10.77.0.1:29611" in c10d
    assert "is_host=true" in c10d and "--local-addr 10.77.0.1" in c10d
    assert "--max-restarts 0 -m lesson10.run" in c10d and "--max-restarts 0" in joined
    assert "is_host=false" in " ".join(twohost.torchrun_argv(1, ["ring"], rdzv="c10d"))
    with pytest.raises(ValueError, match="rdzv"):
        twohost.torchrun_argv(0, ["ring"], rdzv="etcd")


def test_the_bucket_grows_with_the_rate():
    assert twohost.default_burst(None) == twohost.default_burst("8mbit") == f"{256 * 1024}b"
    assert twohost.default_burst("10gbit") == "12500000b"      # 10 ms of 1.25 GB/s
    assert twohost.default_burst("1gbps") == "10000000b"


def test_a_rate_is_a_number_and_one_of_tcs_units():
    assert twohost.parse_rate("100mbit") == 12.5e6 and twohost.parse_rate("1gbps") == 1e9
    assert twohost.parse_rate("800") == 100.0                   # no unit: bit/s, as tc reads it
    for bad in ("bogus", "0mbit", "-5mbit", "10 furlongs", ""):
        with pytest.raises(ValueError, match="not a rate"):
            twohost.parse_rate(bad)
