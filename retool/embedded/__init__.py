"""Embedded stand-ins for cluster services, started on 127.0.0.1 for the local demo and ``retool eval``.

On a cluster the operator runs the sandbox as a Deployment and the chart installs MLflow; on a
laptop the same servers run as child processes of the command that needs them, bound to the
loopback interface, and are stopped (the whole process group) when it ends.
"""
