"""Autoscaling a Fray cluster through a VM provider (seed ``001_…`` "Clusters"; ``docs/autoscaling.md``).

:mod:`fray.cluster.server.autoscale.config` reads the cluster file, :mod:`fray.cluster.server.autoscale.provider`
defines what a provider does, and the autoscaler in the controller turns unplaceable
demand into slices of VMs and idle VMs back into nothing.
"""
