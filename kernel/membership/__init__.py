"""Membership kept in etcd v3 (the ``etcd`` extra), through etcd's JSON gateway.

* :mod:`.etcd_membership` -- a client's view of the fleet: a prefix watched, re-listed
  when a watch goes stale, fed to :class:`~ctlwire.kernel.core.membership.Membership`.
* :mod:`.etcd_registration` -- an engine's entry under a lease, kept alive, re-registered
  as a new incarnation when the lease is lost.
* :mod:`.etcd_gateway` -- the HTTP calls to etcd's gateway both of them make.

Which ranks are present and admitted is decided by the sans-IO
:mod:`ctlwire.kernel.core.membership`; the store says who should be there,
heartbeats say who is alive.
"""
