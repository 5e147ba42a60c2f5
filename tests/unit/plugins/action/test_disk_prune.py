"""Action plugin of disk_prune (plugins/action/disk_prune.py): a ProgressAction that runs a report-only run as usual."""


def test_disk_prune_report_only_runs_as_usual():
    from ansible_collections.ttfleet.inference.plugins.action import disk_prune

    plugin = disk_prune.ActionModule.__new__(disk_prune.ActionModule)
    assert plugin.PROGRESS_NAME == "disk_prune"
    assert plugin._runs_sync({"kinds": []})
    assert not plugin._runs_sync({"kinds": ["volumes"]}) and not plugin._runs_sync({})
