#!/bin/sh
# Makes ./fed for the manifests here: 'scellis federation init' with the
# aggregators at the StatefulSet's pod names (pod i is agg-(i+1)), state
# under /var/lib/scellis and silo-1's data under /srv/scellis/silo-1 (the
# mounts), and the listeners a pod needs: the API and Raft on every
# interface (the pod's DNS name is its own address only once the pod
# exists) and the health endpoints the probes ask, 0.0.0.0:7480 for an
# aggregator, /healthz on 0.0.0.0:7490 for the silo.
# NAMESPACE (default scellis) must match kustomization.yaml's.
set -eu
cd "$(dirname "$0")"
ns=${NAMESPACE:-scellis}
svc=scellis-aggregator.$ns.svc.cluster.local
scellis federation init --dir fed --aggregators 3 --silos 1 --researcher "${RESEARCHER:-alice}" \
	--state-dir /var/lib/scellis \
	--hosts "scellis-aggregator-0.$svc,scellis-aggregator-1.$svc,scellis-aggregator-2.$svc"
for i in 1 2 3; do
	printf 'listen: 0.0.0.0:7400\nraft_listen: 0.0.0.0:7401\nhealth_listen: 0.0.0.0:7480\n' >>"fed/agg-$i/aggregator.yaml"
done
printf 'metrics_listen: 0.0.0.0:7490\n' >>fed/silo-1/silo.yaml
