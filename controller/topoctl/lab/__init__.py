"""The lab: a whole cluster of hosts on one Linux machine (namespaces, shaped cables, management
network, sshd per host). See docs/lab.md; `topoctl lab --help` for the commands."""
