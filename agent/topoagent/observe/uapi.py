"""rtnetlink's numbers and header layouts (linux/netlink.h, rtnetlink.h, if_addr.h,
fib_rules.h, pkt_sched.h, pkt_cls.h): one copy for the dump reader
(`topoagent.observe.nldump`) and the batch writer (`topoagent.drivers.nlwrite`)."""

from __future__ import annotations

import struct

NETLINK_ROUTE = 0
# message types: NEW, DEL, GET of each object
NLMSG_NOOP, NLMSG_ERROR, NLMSG_DONE = 1, 2, 3
RTM_NEWLINK, RTM_GETLINK = 16, 18
RTM_NEWADDR, RTM_DELADDR, RTM_GETADDR = 20, 21, 22
RTM_NEWROUTE, RTM_DELROUTE, RTM_GETROUTE = 24, 25, 26
RTM_NEWRULE, RTM_DELRULE, RTM_GETRULE = 32, 33, 34
RTM_NEWQDISC, RTM_DELQDISC, RTM_GETQDISC = 36, 37, 38
RTM_NEWTCLASS, RTM_DELTCLASS, RTM_GETTCLASS = 40, 41, 42
RTM_NEWTFILTER, RTM_DELTFILTER, RTM_GETTFILTER = 44, 45, 46
# flags
NLM_F_REQUEST, NLM_F_ACK, NLM_F_DUMP = 0x1, 0x4, 0x300
NLM_F_REPLACE, NLM_F_EXCL, NLM_F_CREATE = 0x100, 0x200, 0x400
# attributes
IFLA_ADDRESS, IFLA_IFNAME, IFLA_MTU = 1, 3, 4
IFA_ADDRESS, IFA_LOCAL, IFA_FLAGS, IFA_PROTO = 1, 2, 8, 11
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_PRIORITY, RTA_PREFSRC = 1, 4, 5, 6, 7
RTA_MULTIPATH, RTA_TABLE = 9, 15
FRA_DST, FRA_SRC, FRA_IIFNAME, FRA_GOTO, FRA_PRIORITY = 1, 2, 3, 4, 6
FRA_FWMARK, FRA_FLOW, FRA_TUN_ID, FRA_SUPPRESS_IFGROUP, FRA_SUPPRESS_PREFIXLEN = 10, 11, 12, 13, 14
FRA_TABLE, FRA_FWMASK, FRA_OIFNAME, FRA_L3MDEV, FRA_UID_RANGE = 15, 16, 17, 19, 20
FRA_PROTOCOL, FRA_IP_PROTO, FRA_SPORT_RANGE, FRA_DPORT_RANGE = 21, 22, 23, 24
TCA_KIND, TCA_OPTIONS = 1, 2
TCA_HTB_PARMS, TCA_HTB_INIT, TCA_HTB_RATE64, TCA_HTB_CEIL64 = 1, 2, 6, 7
TCA_U32_CLASSID, TCA_U32_SEL = 1, 5

# family-specific headers after nlmsghdr
RTMSG = struct.Struct("=BBBBBBBBI")  # rtmsg, and fib_rule_hdr (same shape)
IFINFOMSG = struct.Struct("=BxHiII")  # family, type, index, flags, change
IFADDRMSG = struct.Struct("=BBBBI")
TCMSG = struct.Struct("=BxxxiIII")
