#!/bin/sh
# The pool as an epp endpoints file: every Ready pod of this namespace labelled llm-d.ai/role
# and app.kubernetes.io/part-of=epp-pd, at its pod IP, port 8000 (vLLM on prefill pods,
# the sidecar on decode pods), role label kept. Written atomically for `epp serve
# --endpoints` and applied as ConfigMap epp-pool (the decode sidecars' allowlist).
# --once: write the file and exit (the init container).
set -eu
out=/var/run/epp-pool/pool.yaml
template='{{range .items}}{{if .status.podIP}}{{$ready := false}}{{range .status.conditions}}{{if and (eq .type "Ready") (eq .status "True")}}{{$ready = true}}{{end}}{{end}}{{if $ready}}- name: {{.metadata.name}}
  address: {{.status.podIP}}
  port: 8000
  labels: {llm-d.ai/role: {{index .metadata.labels "llm-d.ai/role"}}}
{{end}}{{end}}{{end}}'
while true; do
  if kubectl get pods -l 'llm-d.ai/role,app.kubernetes.io/part-of=epp-pd' \
      -o go-template="$template" > "$out.tmp"; then
    [ -s "$out.tmp" ] || echo '[]' > "$out.tmp"
    if ! cmp -s "$out.tmp" "$out"; then
      mv "$out.tmp" "$out"
      echo "pool: $(grep -c '^- name' "$out" || true) endpoints"
    fi
    kubectl create configmap epp-pool --from-file=pool.yaml="$out" --dry-run=client -o yaml \
      | kubectl apply -f - > /dev/null || echo "could not update ConfigMap epp-pool" >&2
  else
    echo "listing pods failed; keeping the last pool" >&2
  fi
  [ "${1:-}" = "--once" ] && exit 0
  sleep 5
done
