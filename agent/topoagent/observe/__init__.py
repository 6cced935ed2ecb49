"""Observing the host: its network state read through netlink, /proc/sys and OVSDB (`host`),
with the fast read-only rtnetlink dumps it uses (`nldump`)."""
