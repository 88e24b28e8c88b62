"""The device's history: every quickstart's pairs of repeats kept in a ledger, pooled by later ones."""
import json
import shutil
from pathlib import Path

import pytest

from stepcal.experiments.campaign import Campaign, CampaignConfig
from stepcal.experiments.validation import device_history
from stepcal.experiments.validation.device_history import HistoryEntry, history_file, read_history, record_runs
from stepcal.experiments.validation.measured import load_measured_run
from stepcal.experiments.validation.scatter import pooled_run_cv, speed_log_ratios


def entry(run, ratios=(0.1,), campaign="/c", **device):
    return HistoryEntry(str(run), campaign, "2026-12-02T00:00:00+00:00",
                        {"device": "cpu", "cpu_model": "X", "num_cpus": 2, **device}, tuple(ratios))


def write_ledger(path, entries, extra_lines=()):
    path.write_text("".join(json.dumps(e.to_dict()) + "\n" for e in entries) + "".join(extra_lines))


def test_recorded_runs_keep_their_pairs_and_device_and_a_rerun_replaces_its_entries(paired_runs, tmp_path):
    ledger = tmp_path / "cache" / "history.jsonl"
    added = record_runs(ledger, [paired_runs["a"], paired_runs["single"], paired_runs["four"]], "campaign")
    assert [e.run for e in added] == [str(paired_runs["a"].resolve()), str(paired_runs["four"].resolve())]
    for e in added:    # the single-repeat run has no pair: passed over
        run = load_measured_run(e.run)
        assert list(e.ratios) == pytest.approx(speed_log_ratios(run))
        assert e.device == {k: run.meta.fingerprint[k] for k in device_history.DEVICE_FIELDS
                            if k in run.meta.fingerprint}
        assert e.campaign == str(Path("campaign").resolve())
    assert len(added[1].ratios) == 2       # four repeats: two pairs
    assert read_history(ledger).entries == tuple(added)
    again = record_runs(ledger, [paired_runs["four"], paired_runs["b"]], "later")
    runs = [e.run for e in read_history(ledger).entries]
    assert runs == [added[0].run, *(e.run for e in again)]   # four's entry replaced, not doubled
    assert not list(ledger.parent.glob(".*"))                   # no temporary file left beside it


def test_only_the_same_devices_entries_outside_the_excluded_directories_match(tmp_path):
    here = {"device": "cpu", "cpu_model": "X", "num_cpus": 2, "num_threads": 1, "hostname": "vm-7"}
    entries = (entry(tmp_path / "old/qs/measured/a"), entry(tmp_path / "old/qs/measured/b", num_threads=1),
               entry(tmp_path / "other", cpu_model="Y"), entry(tmp_path / "now/measured/a"),
               entry(tmp_path / "named/run"))
    history = device_history.History(entries)
    assert history.matching(here) == list(entries[:2]) + [entries[3], entries[4]]
    assert history.matching(here, exclude_under=[tmp_path / "now", tmp_path / "named"]) == list(entries[:2])
    assert history.matching(None) == []     # a run without a fingerprint: no device to match


def test_unreadable_lines_are_counted_and_left_out_and_the_oldest_entries_go_past_the_cap(tmp_path, monkeypatch):
    ledger = tmp_path / "history.jsonl"
    good = [entry(tmp_path / f"r{i}", ratios=(0.01 * (i + 1),)) for i in range(3)]
    write_ledger(ledger, good, ["not json\n", json.dumps({"run": "x"}) + "\n",
                                json.dumps({**good[0].to_dict(), "log_ratios": []}) + "\n", "\n"])
    read = read_history(ledger)
    assert read.entries == tuple(good) and read.num_unreadable == 3
    assert read_history(tmp_path / "none.jsonl") == device_history.History(())
    monkeypatch.setattr(device_history, "MAX_ENTRIES", 3)
    device_history._rewrite(ledger, [entry(tmp_path / "new")])
    assert [e.run for e in read_history(ledger).entries] == [good[1].run, good[2].run, str(tmp_path / "new")]


def test_the_ledger_is_found_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("STEPCAL_HISTORY", str(tmp_path / "h.jsonl"))
    assert history_file() == tmp_path / "h.jsonl"
    monkeypatch.setenv("STEPCAL_HISTORY", "off")
    assert history_file() is None
    monkeypatch.delenv("STEPCAL_HISTORY")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert history_file() == tmp_path / "xdg" / "stepcal" / "device_history.jsonl"


def test_calibrate_pools_history_pairs_whose_runs_are_gone(paired_runs, tmp_path):
    from stepcal.experiments.calibration import calibrate_step_model
    gone = tmp_path / "gone"
    shutil.copytree(paired_runs["b"], gone)
    [recorded] = record_runs(tmp_path / "h.jsonl", [gone], "earlier")
    shutil.rmtree(gone)
    out = tmp_path / "cal"
    calibrate_step_model(str(paired_runs["a"]), "const:1", str(out), max_simulations=20,
                         history=[recorded.pairs(), HistoryEntry("/also/gone", "c", "t", recorded.device, (0.3, -0.1)).pairs()])
    scatter = json.loads((out / "meta.json").read_text())["scatter"]
    ratios = [*speed_log_ratios(load_measured_run(paired_runs["a"])), *recorded.ratios, 0.3, -0.1]
    assert scatter["run_cv_log_ratios"] == pytest.approx(ratios) and scatter["run_cv_pairs"] == 4
    assert scatter["run_cv"] == pytest.approx(pooled_run_cv(ratios))
    assert scatter["run_cv_runs"] == [str(paired_runs["a"]), str(gone), "/also/gone"]


def test_a_campaign_pools_earlier_campaigns_pairs_and_not_its_own_or_named_runs(tmp_path, monkeypatch):
    from stepcal.profiler.fingerprint import hardware_fingerprint
    here = hardware_fingerprint("cpu", num_threads=1)
    device = {k: here[k] for k in device_history.DEVICE_FIELDS if k in here}
    ledger = tmp_path / "h.jsonl"
    earlier, own, named = (HistoryEntry(str(tmp_path / p), "c", "t", device, (0.1,))
                           for p in ("earlier/measured/a/load_30", "qs/measured/a/load_30", "named/run"))
    elsewhere = HistoryEntry(str(tmp_path / "gpu"), "c", "t", {**device, "device": "cuda:0"}, (0.2,))
    write_ledger(ledger, [earlier, own, named, elsewhere])
    calls = []
    monkeypatch.setattr("stepcal.experiments.campaign.campaign.calibrate_step_model", lambda measured, tables, out, scatter_runs=(),
                        scatter_profiles=(), history=(), step_log=True, retry_hint=None: calls.append(list(history)))
    config = CampaignConfig(out=tmp_path / "qs", schedulers=("a",), repeats=2, history_file=ledger,
                            scatter_runs=(str(tmp_path / "named"),))
    campaign = Campaign(config)
    assert campaign.read_history() == [earlier]
    campaign.history_used = campaign.read_history()
    campaign.calibrate_all({"a": {"kernels": "K"}}, [("kernels", "calibrated")])
    assert calls == [[earlier.pairs()]]
    assert Campaign(CampaignConfig(out=tmp_path / "qs", repeats=2)).read_history() == []          # off
    assert Campaign(CampaignConfig(out=tmp_path / "qs", repeats=1, history_file=ledger)).read_history() == []


def test_quickstart_says_what_the_history_gave_and_got(tmp_path):
    from stepcal.experiments.commands.quickstart import history_text
    ledger = tmp_path / "h.jsonl"
    used = [entry("/e/qs1/a", campaign="/e/qs1"), entry("/e/qs1/b", campaign="/e/qs1"),
            entry("/e/qs2/a", ratios=(0.1, 0.2), campaign="/e/qs2")]
    added = [entry("/n/a"), entry("/n/b")]
    config = CampaignConfig(out=tmp_path / "qs", ranges=20, history_file=ledger)
    assert history_text(config, used, added) == (
        f"device history ({ledger}): run_cv pooled this campaign's pairs with 4 pair(s) of 3 run(s) from "
        "2 earlier campaigns on this machine; added this campaign's 2 run(s) (2 pairs), which later campaigns pool")
    assert "no earlier campaign of this machine in it" in history_text(config, [], added)
    off = CampaignConfig(out=tmp_path / "qs", ranges=20)
    assert history_text(off, [], []).endswith(f"--scatter-runs {tmp_path / 'qs'}")
    for config in (CampaignConfig(out=tmp_path / "qs", ranges=0),
                   CampaignConfig(out=tmp_path / "qs", ranges=20, scatter_runs=(str(tmp_path / "earlier"),)),
                   CampaignConfig(out=tmp_path / "qs", ranges=20, repeats=1, history_file=ledger)):
        assert history_text(config, [], []) is None


def test_the_quickstart_flag_and_its_help_name_the_ledger(monkeypatch, tmp_path, capsys):
    from stepcal.experiments.cli import main
    monkeypatch.setenv("STEPCAL_HISTORY", str(tmp_path / "env.jsonl"))
    assert history_file(None) == tmp_path / "env.jsonl"
    assert history_file("off") is None and history_file(str(tmp_path / "f")) == tmp_path / "f"
    assert main(["quickstart", "--help"]) == 0
    assert f"${device_history.ENV}" in " ".join(capsys.readouterr().out.split())


def test_quickstart_refuses_a_history_it_could_not_write_before_any_work(tmp_path, capsys):
    from stepcal.experiments.cli import main
    out = tmp_path / "qs"
    (tmp_path / "a_directory").mkdir()
    assert main(["quickstart", "--history", str(tmp_path / "a_directory"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"--history {tmp_path / 'a_directory'}: " in err and err.count("\n") == 1 and not out.exists()


def test_a_campaign_goes_on_without_a_ledger_it_cannot_read_or_write(paired_runs, tmp_path, capsys):
    """The default ledger is not the user's choice: a directory in its place costs a warning, not the campaign."""
    (tmp_path / "h.jsonl").mkdir()
    config = CampaignConfig(out=tmp_path / "qs", schedulers=("a",), loads=(0.3,), repeats=2,
                            history_file=tmp_path / "h.jsonl")
    shutil.copytree(paired_runs["a"], config.measured_dir("a", 0.3))
    campaign = Campaign(config)
    assert campaign.read_history() == []
    campaign.record_history()
    err = capsys.readouterr().err
    assert "cannot read the device history" in err and "cannot add to the device history" in err
    assert campaign.history_added == []
