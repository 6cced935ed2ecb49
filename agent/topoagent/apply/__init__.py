"""Changing the host: desired vs observed -> ordered kernel operations (`diff`, `kernel_ops`,
`ovs`), the transaction that applies, verifies and reverts them (`transaction`, `probe`,
`mgmt`), its crash-safe undo log and applied-state history (`journal`, `store`),
confirm-or-revert (`confirm`) and the reconcile loop (`watch`)."""
