#!/bin/sh
# partkeeper's NATS roles as scoped signing keys of the PARTKEEPER account (NATS JWT mode), one
# per role, the node written as the template {{tag(node)}} so one set of roles serves every node.
# GENERATED from partkeeper/bus/permissions.py (python -m partkeeper.bus.permissions_render nsc);
# tests/reliability/test_shipped_permissions.py fails when this file and the table differ.
#
# Run once per account (after `nsc add operator`, `nsc add account PARTKEEPER`,
# `nsc edit account PARTKEEPER --js-enable 1`). Then per node and role, a user tagged with the
# node's subject token:
#   nsc add user --account PARTKEEPER --name <role>-<node> -K <role> --tag node:<token>
# and the provisioning identity once (its role names no node):
#   nsc add user --account PARTKEEPER --name provision -K provision
# docs/security.md says the rest.
set -eu

# the account's JetStream limits (docs/operations.md, Sizing)
nsc edit account PARTKEEPER --js-disk-storage 7G --js-mem-storage 64M --js-streams 6 --js-consumer 60000

# pk-watcher: the only publisher of Pod events; answers pods.get, pods.states and pods.pending; reads the partition audit log (its Event recorder's durable) and dead-letters there.
nsc edit signing-key --account PARTKEEPER --sk generate --role watcher \
  --allow-pub 'pk.pods.{{tag(node)}}.*' \
  --allow-pub 'pk.dlq.{{tag(node)}}.watcher-events' \
  --allow-pub '$KV.pk-pods.{{tag(node)}}.>' \
  --allow-pub '$JS.API.STREAM.INFO.PK_PODS' \
  --allow-pub '$JS.API.STREAM.INFO.PK_PARTITIONS' \
  --allow-pub '$JS.API.STREAM.INFO.PK_DLQ' \
  --allow-pub '$JS.API.STREAM.INFO.KV_pk-claims' \
  --allow-pub '$JS.API.STREAM.INFO.KV_pk-pods' \
  --allow-pub '$JS.API.STREAM.INFO.KV_pk-capacity' \
  --allow-pub '$JS.API.DIRECT.GET.KV_pk-pods.$KV.pk-pods.{{tag(node)}}.>' \
  --allow-pub '$JS.API.CONSUMER.INFO.PK_PARTITIONS.watcher-events-pk_partitions-{{tag(node)}}' \
  --allow-pub '$JS.API.CONSUMER.CREATE.PK_PARTITIONS.watcher-events-pk_partitions-{{tag(node)}}.pk.parts.{{tag(node)}}.*' \
  --allow-pub '$JS.API.CONSUMER.MSG.NEXT.PK_PARTITIONS.watcher-events-pk_partitions-{{tag(node)}}' \
  --allow-pub '$JS.ACK.PK_PARTITIONS.watcher-events-pk_partitions-{{tag(node)}}.>' \
  --allow-pub '_INBOX.{{tag(node)}}.allocator.>' \
  --allow-pub '_INBOX.{{tag(node)}}.reclaimer.>' \
  --allow-pub '_INBOX.{{tag(node)}}.gc.>' \
  --allow-pub '_INBOX.{{tag(node)}}.admin.>' \
  --allow-sub '_INBOX.{{tag(node)}}.watcher.>' \
  --allow-sub 'pk.{{tag(node)}}.pods.get' \
  --allow-sub 'pk.{{tag(node)}}.pods.states' \
  --allow-sub 'pk.{{tag(node)}}.pods.pending' \
  --allow-sub '$SRV.PING' \
  --allow-sub '$SRV.INFO' \
  --allow-sub '$SRV.STATS' \
  --allow-sub '$SRV.*.pk-watcher' \
  --allow-sub '$SRV.*.pk-watcher.*'

# pk-allocator: claims (write-ahead) and capacity; asks pods.get, pods.pending and reclaim.now; answers claims.query; publishes claim transitions of this node's cards.
nsc edit signing-key --account PARTKEEPER --sk generate --role allocator \
  --allow-pub 'pk.parts.{{tag(node)}}.*' \
  --allow-pub 'pk.{{tag(node)}}.pods.get' \
  --allow-pub 'pk.{{tag(node)}}.pods.pending' \
  --allow-pub 'pk.{{tag(node)}}.reclaim.now' \
  --allow-pub '$KV.pk-claims.{{tag(node)}}.>' \
  --allow-pub '$KV.pk-capacity.{{tag(node)}}' \
  --allow-pub '$JS.API.STREAM.INFO.PK_PODS' \
  --allow-pub '$JS.API.STREAM.INFO.PK_PARTITIONS' \
  --allow-pub '$JS.API.STREAM.INFO.PK_DLQ' \
  --allow-pub '$JS.API.STREAM.INFO.KV_pk-claims' \
  --allow-pub '$JS.API.STREAM.INFO.KV_pk-pods' \
  --allow-pub '$JS.API.STREAM.INFO.KV_pk-capacity' \
  --allow-pub '$JS.API.DIRECT.GET.KV_pk-claims.$KV.pk-claims.{{tag(node)}}.>' \
  --allow-pub '$JS.API.DIRECT.GET.KV_pk-pods.$KV.pk-pods.{{tag(node)}}.>' \
  --allow-pub '$JS.API.CONSUMER.CREATE.KV_pk-claims.*.$KV.pk-claims.{{tag(node)}}.>' \
  --allow-pub '$JS.FC.KV_pk-claims.>' \
  --allow-pub '$JS.API.CONSUMER.CREATE.KV_pk-pods.*.$KV.pk-pods.{{tag(node)}}.>' \
  --allow-pub '$JS.FC.KV_pk-pods.>' \
  --allow-pub '$JS.API.CONSUMER.CREATE.PK_PARTITIONS.*.pk.parts.{{tag(node)}}.>' \
  --allow-pub '$JS.FC.PK_PARTITIONS.>' \
  --allow-pub '_INBOX.{{tag(node)}}.gc.>' \
  --allow-pub '_INBOX.{{tag(node)}}.admin.>' \
  --deny-pub '$JS.API.CONSUMER.CREATE.PK_PARTITIONS.watcher-events-pk_partitions-{{tag(node)}}.>' \
  --deny-pub 'pk.parts.{{tag(node)}}.gc' \
  --allow-sub '_INBOX.{{tag(node)}}.allocator.>' \
  --allow-sub 'pk.{{tag(node)}}.claims.query' \
  --allow-sub '$SRV.PING' \
  --allow-sub '$SRV.INFO' \
  --allow-sub '$SRV.STATS' \
  --allow-sub '$SRV.*.pk-allocator' \
  --allow-sub '$SRV.*.pk-allocator.*'

# pk-reclaimer: consumes this node's Pod events (its durable), releases and removes claims, asks pods.get, answers reclaim.now, publishes claim transitions and foreign instances of this node's cards, dead-letters under its own name.
nsc edit signing-key --account PARTKEEPER --sk generate --role reclaimer \
  --allow-pub 'pk.parts.{{tag(node)}}.*' \
  --allow-pub 'pk.dlq.{{tag(node)}}.reclaimer' \
  --allow-pub 'pk.{{tag(node)}}.pods.get' \
  --allow-pub '$KV.pk-claims.{{tag(node)}}.>' \
  --allow-pub '$JS.API.STREAM.INFO.PK_PODS' \
  --allow-pub '$JS.API.STREAM.INFO.PK_PARTITIONS' \
  --allow-pub '$JS.API.STREAM.INFO.PK_DLQ' \
  --allow-pub '$JS.API.STREAM.INFO.KV_pk-claims' \
  --allow-pub '$JS.API.STREAM.INFO.KV_pk-pods' \
  --allow-pub '$JS.API.STREAM.INFO.KV_pk-capacity' \
  --allow-pub '$JS.API.DIRECT.GET.KV_pk-claims.$KV.pk-claims.{{tag(node)}}.>' \
  --allow-pub '$JS.API.CONSUMER.INFO.PK_PODS.reclaimer-pk_pods-{{tag(node)}}' \
  --allow-pub '$JS.API.CONSUMER.CREATE.PK_PODS.reclaimer-pk_pods-{{tag(node)}}.pk.pods.{{tag(node)}}.*' \
  --allow-pub '$JS.API.CONSUMER.MSG.NEXT.PK_PODS.reclaimer-pk_pods-{{tag(node)}}' \
  --allow-pub '$JS.ACK.PK_PODS.reclaimer-pk_pods-{{tag(node)}}.>' \
  --allow-pub '_INBOX.{{tag(node)}}.allocator.>' \
  --allow-pub '_INBOX.{{tag(node)}}.admin.>' \
  --deny-pub 'pk.parts.{{tag(node)}}.node' \
  --deny-pub 'pk.parts.{{tag(node)}}.gc' \
  --allow-sub '_INBOX.{{tag(node)}}.reclaimer.>' \
  --allow-sub 'pk.{{tag(node)}}.reclaim.now' \
  --allow-sub '$SRV.PING' \
  --allow-sub '$SRV.INFO' \
  --allow-sub '$SRV.STATS' \
  --allow-sub '$SRV.*.pk-reclaimer' \
  --allow-sub '$SRV.*.pk-reclaimer.*'

# pk-gc: consumes this node's Pod events (its durable), asks pods.get, pods.states and claims.query, announces collected working directories on its own audit subject only; it cannot publish Pod events, claim transitions of a card, the allocator's refusals, or call reclaim.now.
nsc edit signing-key --account PARTKEEPER --sk generate --role gc \
  --allow-pub 'pk.parts.{{tag(node)}}.gc' \
  --allow-pub 'pk.dlq.{{tag(node)}}.gc' \
  --allow-pub 'pk.{{tag(node)}}.pods.get' \
  --allow-pub 'pk.{{tag(node)}}.pods.states' \
  --allow-pub 'pk.{{tag(node)}}.claims.query' \
  --allow-pub '$JS.API.STREAM.INFO.PK_PODS' \
  --allow-pub '$JS.API.STREAM.INFO.PK_PARTITIONS' \
  --allow-pub '$JS.API.STREAM.INFO.PK_DLQ' \
  --allow-pub '$JS.API.STREAM.INFO.KV_pk-claims' \
  --allow-pub '$JS.API.STREAM.INFO.KV_pk-pods' \
  --allow-pub '$JS.API.STREAM.INFO.KV_pk-capacity' \
  --allow-pub '$JS.API.CONSUMER.INFO.PK_PODS.gc-pk_pods-{{tag(node)}}' \
  --allow-pub '$JS.API.CONSUMER.CREATE.PK_PODS.gc-pk_pods-{{tag(node)}}.pk.pods.{{tag(node)}}.*' \
  --allow-pub '$JS.API.CONSUMER.MSG.NEXT.PK_PODS.gc-pk_pods-{{tag(node)}}' \
  --allow-pub '$JS.ACK.PK_PODS.gc-pk_pods-{{tag(node)}}.>' \
  --allow-sub '_INBOX.{{tag(node)}}.gc.>'

# pk-provision: `partkeeper provision`: creates and updates the streams and buckets; nothing else.
nsc edit signing-key --account PARTKEEPER --sk generate --role provision \
  --allow-pub '$JS.API.STREAM.INFO.PK_PODS' \
  --allow-pub '$JS.API.STREAM.CREATE.PK_PODS' \
  --allow-pub '$JS.API.STREAM.UPDATE.PK_PODS' \
  --allow-pub '$JS.API.STREAM.INFO.PK_PARTITIONS' \
  --allow-pub '$JS.API.STREAM.CREATE.PK_PARTITIONS' \
  --allow-pub '$JS.API.STREAM.UPDATE.PK_PARTITIONS' \
  --allow-pub '$JS.API.STREAM.INFO.PK_DLQ' \
  --allow-pub '$JS.API.STREAM.CREATE.PK_DLQ' \
  --allow-pub '$JS.API.STREAM.UPDATE.PK_DLQ' \
  --allow-pub '$JS.API.STREAM.INFO.KV_pk-claims' \
  --allow-pub '$JS.API.STREAM.CREATE.KV_pk-claims' \
  --allow-pub '$JS.API.STREAM.UPDATE.KV_pk-claims' \
  --allow-pub '$JS.API.STREAM.INFO.KV_pk-pods' \
  --allow-pub '$JS.API.STREAM.CREATE.KV_pk-pods' \
  --allow-pub '$JS.API.STREAM.UPDATE.KV_pk-pods' \
  --allow-pub '$JS.API.STREAM.INFO.KV_pk-capacity' \
  --allow-pub '$JS.API.STREAM.CREATE.KV_pk-capacity' \
  --allow-pub '$JS.API.STREAM.UPDATE.KV_pk-capacity' \
  --allow-sub '_INBOX._cluster.provision.>'
