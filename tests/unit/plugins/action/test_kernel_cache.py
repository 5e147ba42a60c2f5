"""Action plugin of kernel_cache (plugins/action/kernel_cache.py): a ProgressAction that runs an inspection as usual."""

from ansible_collections.ttfleet.inference.plugins.plugin_utils import progress_action as act


def test_kernel_cache_inspection_runs_as_usual():
    from ansible_collections.ttfleet.inference.plugins.action import kernel_cache

    plugin = kernel_cache.ActionModule.__new__(kernel_cache.ActionModule)
    assert plugin.PROGRESS_NAME == "kernel_cache"
    assert plugin._runs_sync({"state": "inspected"}) and not plugin._runs_sync({"state": "deployed"})
    assert act.progress_line("h", {"done_bytes": 1, "total_bytes": 2}, 1, what="kernel_cache").startswith(
        "h: kernel_cache 1 B of 2 B (50.0%)"
    )
