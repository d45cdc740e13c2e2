"""Real multi-host runs on one machine: network namespaces, tc-shaped links, torchrun across.

    layout.py    ClusterLayout: names and addresses of a cluster's hosts (pure)
    commands.py  the ip / tc commands that build, shape and remove it (pure)
    state.py     the state file of every cluster made, so `down` works after a crash
    system.py    running those commands; root and netem detection
    manage.py    up / status / down
    run.py       torchrun in every host namespace, exit codes collected
"""

from approxdist.cluster.layout import ClusterLayout
from approxdist.cluster.manage import cluster_down, cluster_status, cluster_up
from approxdist.cluster.run import run_on_cluster

__all__ = ["ClusterLayout", "cluster_down", "cluster_status", "cluster_up", "run_on_cluster"]
