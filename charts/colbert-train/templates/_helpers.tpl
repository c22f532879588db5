{{/*
The job name: the release name, which must be a DNS-1035 label short enough for
its longest pod name to fit in 63 characters: "<name>-worker-<i>" for a PyTorchJob, JobSet's
"<name>-node-0-<i>" for a TrainJob (the same rule as `colbert-k8s --name`, JobSpec.pod_names).
*/}}
{{- define "colbert-train.name" -}}
{{- $name := .Release.Name -}}
{{- if not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" $name) -}}
{{- fail (printf "release name %q must be a DNS-1035 label (lowercase letters, digits, '-', starting with a letter)" $name) -}}
{{- end -}}
{{- $longest := ternary (printf "%s-worker-%d" $name (sub (int .Values.nodes) 2)) (printf "%s-master-0" $name) (gt (int .Values.nodes) 1) -}}
{{- with .Values.elastic -}}{{/* Workers only, up to MAX of them */}}
{{- $longest = printf "%s-worker-%d" $name (sub (max (int $.Values.nodes) (int (splitList ":" .| last))) 1) -}}
{{- end -}}
{{- if eq (.Values.api | default "pytorchjob") "trainjob" -}}
{{- $longest = printf "%s-node-0-%d" $name (sub (int .Values.nodes) 1) -}}
{{- end -}}
{{- if gt (len $longest) 63 -}}
{{- fail (printf "release name %q is too long: pod name %q would exceed 63 characters" $name $longest) -}}
{{- end -}}
{{- $name -}}
{{- end -}}

{{/*
Labels for one component: the same four app.kubernetes.io labels as the CLI, plus the user's,
plus helm.sh/chart (the only helm-only label; listed in the CLI-equivalence test).
*/}}
{{- define "colbert-train.labels" -}}
app.kubernetes.io/name: colbert-k8s
app.kubernetes.io/instance: {{ include "colbert-train.name" .root | quote }}
app.kubernetes.io/managed-by: colbert-k8s
app.kubernetes.io/component: {{ .component | quote }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | quote }}
{{- range $k, $v := .root.Values.labels }}
{{ include "colbert-train.key" $k }}: {{ $v | quote }}
{{- end }}
{{- end -}}

{{/*
A label or annotation key, validated and quoted: values.schema.json already refuses a bad key
(propertyNames); this guard keeps a key from ever changing the YAML's structure even if the schema is
skipped. The pattern is rules.PATTERNS["qualified_name"] (tests/test_chart.py renders keys both ways).
*/}}
{{- define "colbert-train.key" -}}
{{- if or (gt (len .) 317) (not (regexMatch "^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$" .)) -}}
{{- fail (printf "label/annotation key %q is not a valid qualified name like example.com/name" .) -}}
{{- end -}}
{{- . | quote -}}
{{- end -}}

{{/* The claim mounted at /workspace, if any. Same rule as the CLI: nodes > 1 needs a claim or podLocal. */}}
{{- define "colbert-train.claim" -}}
{{- $p := .Values.persistence -}}
{{- if and (gt (int .Values.nodes) 1) (not (or $p.existingClaim $p.size $p.podLocal)) -}}
{{- fail (printf "nodes %d without shared storage: checkpoints would live only in the master pod's emptyDir; set persistence.size (a new ReadWriteMany claim) or persistence.existingClaim, or persistence.podLocal: true to accept that" (int .Values.nodes)) -}}
{{- end -}}
{{- if and $p.podLocal (or $p.existingClaim $p.size) -}}
{{- fail "persistence.podLocal excludes persistence.existingClaim and persistence.size: keep one" -}}
{{- end -}}
{{- if .Values.persistence.existingClaim -}}
{{- .Values.persistence.existingClaim -}}
{{- else if .Values.persistence.size -}}
{{- printf "%s-workspace" (include "colbert-train.name" .) -}}
{{- end -}}
{{- end -}}

{{/* The service account the pods run as, if any. */}}
{{- define "colbert-train.serviceAccount" -}}
{{- if .Values.serviceAccount.name -}}
{{- .Values.serviceAccount.name -}}
{{- else if .Values.serviceAccount.create -}}
{{- include "colbert-train.name" . -}}
{{- end -}}
{{- end -}}

{{/* NCCL presets: must equal operator_cli.spec.NCCL_PRESETS (the equivalence test checks). */}}
{{- define "colbert-train.ncclEnv" -}}
{{- $presets := dict
  "socket" (dict "NCCL_IB_DISABLE" "1" "NCCL_SOCKET_IFNAME" "eth0" "NCCL_DEBUG" "WARN")
  "ib" (dict "NCCL_IB_DISABLE" "0" "NCCL_SOCKET_IFNAME" "eth0" "NCCL_NET_GDR_LEVEL" "PHB" "NCCL_DEBUG" "WARN") -}}
{{- if .Values.nccl -}}
{{- if eq (int .Values.gpusPerNode) 0 -}}
{{- fail "nccl applies to GPU jobs only: unset nccl or set gpusPerNode" -}}
{{- end -}}
{{- toYaml (get $presets .Values.nccl) -}}
{{- end -}}
{{- end -}}

{{/* Pod-level fields shared by both APIs (a TrainJob cannot patch priorityClassName). */}}
{{- define "colbert-train.podFields" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- with include "colbert-train.serviceAccount" $root }}
serviceAccountName: {{ . | quote }}
{{- end }}
{{- if .priority }}
{{- with $v.scheduling.priorityClassName }}
priorityClassName: {{ . | quote }}
{{- end }}
{{- end }}
{{- with $v.scheduling.nodeSelector }}
nodeSelector:
  {{- range $k, $val := . }}
  {{ include "colbert-train.key" $k }}: {{ $val | quote }}
  {{- end }}
{{- end }}
{{- with $v.scheduling.tolerations }}
tolerations:
  {{- range . }}
  - key: {{ include "colbert-train.key" .key }}
    operator: {{ .operator | default "Exists" | quote }}
    {{- if hasKey . "value" }}
    value: {{ .value | quote }}
    {{- end }}
    effect: {{ .effect | quote }}
  {{- end }}
{{- end }}
{{- with $v.imagePullSecrets }}
imagePullSecrets:
  {{- range . }}
  - name: {{ . | quote }}
  {{- end }}
{{- end }}
terminationGracePeriodSeconds: {{ int $v.terminationGracePeriodSeconds }}
securityContext:
  runAsNonRoot: true
  runAsUser: 1000
  runAsGroup: 1000
  fsGroup: 1000
  seccompProfile:
    type: RuntimeDefault
{{- end -}}

{{/* The trainer's environment: HF cache, NCCL preset, plain variables, Secret references. */}}
{{- define "colbert-train.env" -}}
{{- $v := .Values -}}
- name: HF_HOME
  value: /workspace/.cache/huggingface
{{- range $k, $val := (include "colbert-train.ncclEnv" . | fromYaml) }}
- name: {{ $k | quote }}
  value: {{ $val | quote }}
{{- end }}
{{- range $k, $val := $v.env }}
- name: {{ $k | quote }}
  value: {{ $val | quote }}
{{- end }}
{{- range $k, $ref := $v.secretEnv }}
- name: {{ $k | quote }}
  valueFrom:
    secretKeyRef:
      name: {{ $ref.secret | quote }}
      key: {{ $ref.key | quote }}
{{- end }}
{{- end -}}

{{/* The GPU resource: whole GPUs, or one MIG slice (same rule as operator_cli/scheduling.py). */}}
{{- define "colbert-train.gpuResource" -}}
{{- with .Values.mig -}}
{{- if ne (int $.Values.gpusPerNode) 1 -}}
{{- fail (printf "mig %s takes one slice per pod, got gpusPerNode %d: a CUDA process sees a single MIG device, so a pod cannot train on several; use gpusPerNode 1 and scale out with nodes" . (int $.Values.gpusPerNode)) -}}
{{- end -}}
{{- printf "nvidia.com/mig-%s" . -}}
{{- else -}}
nvidia.com/gpu
{{- end -}}
{{- end -}}

{{/*
A Kubernetes quantity as a number of bytes (a float): the same arithmetic as operator_cli/resources.py.
*/}}
{{- define "colbert-train.bytes" -}}
{{- $q := toString . -}}
{{- $num := regexFind "^[0-9.]+" $q -}}
{{- $suffix := trimPrefix $num $q -}}
{{- $units := dict "" 1.0 "m" 0.001 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "P" 1e15 "E" 1e18 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "Pi" 1125899906842624.0 "Ei" 1152921504606846976.0 -}}
{{- $mult := 1.0 -}}
{{- if hasKey $units $suffix -}}
{{- $mult = get $units $suffix -}}
{{- else -}}{{/* a decimal exponent, e3 or E+3 */}}
{{- range until (int (trimPrefix "+" (substr 1 (len $suffix) $suffix))) }}{{ $mult = mulf $mult 10.0 }}{{ end -}}
{{- end -}}
{{- mulf (float64 $num) $mult -}}
{{- end -}}

{{/*
The trainer container's resources, as JobSpec.resource_limits and resource_requests: limits are the GPUs,
the RDMA device of nccl ib (rdmaResource) and resources.cpu/memory when set; requests are those, or
derived from gpusPerNode (4 CPUs and 16Gi per GPU; a CPU pod 4 and 8Gi) plus the memory-backed /dev/shm,
which counts against the pod's memory (a resources.memory it would fill is refused).
*/}}
{{- define "colbert-train.resources" -}}
{{- $v := .Values -}}
{{- $gpus := int $v.gpusPerNode -}}
{{- $ib := and (eq $v.nccl "ib") $v.rdmaResource -}}
{{- if and $v.shm.enabled $v.resources.memory -}}
{{- if ge (float64 (include "colbert-train.bytes" $v.shm.size)) (float64 (include "colbert-train.bytes" $v.resources.memory)) -}}
{{- fail (printf "shm.size %s would fill resources.memory %s: /dev/shm is memory-backed and counts against the pod's memory limit; raise resources.memory or lower shm.size" (toString $v.shm.size) (toString $v.resources.memory)) -}}
{{- end -}}
{{- end -}}
{{- if $v.mig -}}{{- $_ := include "colbert-train.gpuResource" . -}}{{- end -}}{{/* its rule holds on CPU pods too */}}
{{- $memory := $v.resources.memory -}}
{{- if not $memory -}}
{{- $mi := ternary (mul 16384 $gpus) 8192 (gt $gpus 0) -}}
{{- if $v.shm.enabled -}}
{{- $mi = add $mi (int64 (ceil (divf (float64 (include "colbert-train.bytes" $v.shm.size)) 1048576.0))) -}}
{{- end -}}
{{- $memory = ternary (printf "%dGi" (div $mi 1024)) (printf "%dMi" $mi) (eq (mod $mi 1024) 0) -}}
{{- end -}}
{{- if or (gt $gpus 0) $ib $v.resources.cpu $v.resources.memory }}
limits:
  {{- if gt $gpus 0 }}
  {{ include "colbert-train.gpuResource" . }}: {{ $gpus }}
  {{- end }}
  {{- if $ib }}
  {{ $v.rdmaResource | quote }}: 1
  {{- end }}
  {{- with $v.resources.cpu }}
  cpu: {{ . | quote }}
  {{- end }}
  {{- with $v.resources.memory }}
  memory: {{ . | quote }}
  {{- end }}
{{- end }}
requests:
  cpu: {{ $v.resources.cpu | default (ternary (mul 4 $gpus) 4 (gt $gpus 0)) | toString | quote }}
  memory: {{ $memory | quote }}
{{- end -}}

{{- define "colbert-train.containerSecurity" -}}
allowPrivilegeEscalation: false
runAsNonRoot: true
capabilities:
  drop:
    - ALL
{{- end -}}

{{/* A job container's security context: the above, plus IPC_LOCK for nccl ib (NCCL pins its buffers). */}}
{{- define "colbert-train.jobContainerSecurity" -}}
{{- include "colbert-train.containerSecurity" . }}
{{- if eq .Values.nccl "ib" }}
  add:
    - IPC_LOCK
{{- end }}
{{- end -}}

{{- define "colbert-train.volumeMounts" -}}
- name: config
  mountPath: /etc/colbert-k8s
  readOnly: true
- name: workspace
  mountPath: /workspace
{{- if .Values.shm.enabled }}
- name: dshm
  mountPath: /dev/shm
{{- end }}
{{- end -}}

{{- define "colbert-train.volumes" -}}
{{- $claim := include "colbert-train.claim" . -}}
- name: config
  configMap:
    name: {{ printf "%s-config" (include "colbert-train.name" .) | quote }}
- name: workspace
  {{- if $claim }}
  persistentVolumeClaim:
    claimName: {{ $claim | quote }}
  {{- else }}
  emptyDir: {}
  {{- end }}
{{- if .Values.shm.enabled }}
- name: dshm
  emptyDir:
    medium: Memory
    sizeLimit: {{ .Values.shm.size | quote }}
{{- end }}
{{- end -}}

{{/* The pod's labels and annotations, for one component. */}}
{{- define "colbert-train.podMetadata" -}}
labels:
  {{- include "colbert-train.labels" (dict "root" .root "component" .component) | nindent 2 }}
annotations:
  sidecar.istio.io/inject: "false"
  {{- $s := .root.Values.scheduling }}
  {{- if and $s.topologyRequired $s.topologyPreferred }}
  {{- fail "scheduling.topologyRequired and scheduling.topologyPreferred exclude each other (Kueue reads one per pod set)" }}
  {{- end }}
  {{- with $s.topologyRequired }}
  kueue.x-k8s.io/podset-required-topology: {{ . | quote }}
  {{- end }}
  {{- with $s.topologyPreferred }}
  kueue.x-k8s.io/podset-preferred-topology: {{ . | quote }}
  {{- end }}
  {{- range $k, $val := .root.Values.annotations }}
  {{ include "colbert-train.key" $k }}: {{ $val | quote }}
  {{- end }}
{{- end -}}

{{/* The image reference. */}}
{{- define "colbert-train.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/*
The PyTorchJob pod template shared by Master and Worker.
*/}}
{{- define "colbert-train.podTemplate" -}}
{{- $root := .root -}}
metadata:
  {{- include "colbert-train.podMetadata" . | nindent 2 }}
spec:
  {{- include "colbert-train.podFields" (dict "root" $root "priority" true) | nindent 2 }}
  containers:
    - name: pytorch
      image: {{ include "colbert-train.image" $root | quote }}
      imagePullPolicy: IfNotPresent
      command:
        - colbert-train
      args:
        - --config
        - /etc/colbert-k8s/train.yaml
      workingDir: /workspace
      ports:
        - name: pytorchjob-port
          containerPort: 23456
          protocol: TCP
      env:
        {{- include "colbert-train.env" $root | nindent 8 }}
        {{- if $root.Values.elastic }}
        # The operator injects no PET_NPROC_PER_NODE into a job without a Master: torchrun reads it here.
        - name: PET_NPROC_PER_NODE
          value: {{ max 1 (int $root.Values.gpusPerNode) | toString | quote }}
        {{- end }}
      resources:
        {{- include "colbert-train.resources" $root | nindent 8 }}
      securityContext:
        {{- include "colbert-train.jobContainerSecurity" $root | nindent 8 }}
      volumeMounts:
        {{- include "colbert-train.volumeMounts" $root | nindent 8 }}
  volumes:
    {{- include "colbert-train.volumes" $root | nindent 4 }}
{{- end -}}

{{/*
An elastic job's (MIN, MAX), checked as JobSpec._check_elastic checks it; empty when not elastic.
Every node count in MIN..MAX must split config.training.global_batch_size (for every loss a split exists
exactly when the processes divide it: trainer.config.schema._split).
*/}}
{{- define "colbert-train.elastic" -}}
{{- with .Values.elastic -}}
{{- $low := int (splitList ":" . | first) -}}
{{- $high := int (splitList ":" . | last) -}}
{{- $flag := printf "elastic %s" . -}}
{{- if or (lt $low 1) (gt $low $high) (gt $high 1024) -}}
{{- fail (printf "%s must have 1 <= MIN <= MAX <= 1024" $flag) -}}
{{- end -}}
{{- if eq $.Values.api "trainjob" -}}
{{- fail (printf "%s: a TrainJob (Kubeflow Trainer v2.3.0) has no elastic policy (KEP-2903 is a proposal); use api: pytorchjob" $flag) -}}
{{- end -}}
{{- if or (lt (int $.Values.nodes) $low) (gt (int $.Values.nodes) $high) -}}
{{- fail (printf "%s: nodes %d (the pods asked for at start) must be within %d..%d" $flag (int $.Values.nodes) $low $high) -}}
{{- end -}}
{{- if not (or $.Values.persistence.existingClaim $.Values.persistence.size) -}}
{{- fail (printf "%s needs shared storage: a group re-formed without a node must find that node's checkpoints; set persistence.size or persistence.existingClaim" $flag) -}}
{{- end -}}
{{- $global := int ((($.Values.config).training | default dict).global_batch_size | default 0) -}}
{{- if not $global -}}
{{- fail (printf "%s needs config.training.global_batch_size: it fixes the batch, and so the mathematics, on every node count" $flag) -}}
{{- end -}}
{{- $nproc := max 1 (int $.Values.gpusPerNode) -}}
{{- range $n := untilStep $low (add $high 1 | int) 1 -}}
{{- if mod $global (mul $n $nproc) -}}
{{- fail (printf "%s: %d node(s) x %d process(es): training.global_batch_size %d cannot be split over %d processes" $flag $n $nproc $global (mul $n $nproc)) -}}
{{- end -}}
{{- end -}}
{{- printf "%d:%d" $low $high -}}
{{- end -}}
{{- end -}}

{{/*
ExitCode (permanent exit codes 1-127 fail at once; 128-255 get a new pod) for a claim and for one pod;
OnFailure only for several pods on per-pod emptyDirs (a restarted worker must find the master's pod and
its checkpoints). Same rule as JobSpec.restart_policy.
*/}}
{{- define "colbert-train.restartPolicy" -}}
{{- $p := .Values.persistence -}}
{{- ternary "OnFailure" "ExitCode" (and (gt (int .Values.nodes) 1) (not (or $p.existingClaim $p.size))) -}}
{{- end -}}

{{/*
config.export.destination needs its credentials in the pods, checked here rather than in
values.schema.json so that a missing one is one line naming the fix (as `colbert-k8s render` says it)
instead of the validator's nest of allOf/anyOf: one of the scheme's sets of secretEnv names (below: written
by `python -m operator_cli.chart_schema` from trainer.destinations.CREDENTIALS), or, for an object store, serviceAccount.name bound
to a cloud role (workload identity). The Hub needs its token whatever the service account.
*/}}
{{- define "colbert-train.exportCredentials" -}}
{{- /* generated by operator_cli.chart_schema from trainer.destinations.CREDENTIALS: do not edit */ -}}
{{- $sets := `{"s3": [["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"], ["AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN"], ["AWS_CONTAINER_CREDENTIALS_FULL_URI"]], "gs": [["GOOGLE_SERVICE_ACCOUNT_KEY"], ["GOOGLE_APPLICATION_CREDENTIALS"], ["GOOGLE_SERVICE_ACCOUNT"]], "az": [["AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY"], ["AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_SAS_KEY"], ["AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_CLIENT_SECRET"], ["AZURE_FEDERATED_TOKEN_FILE"]], "hf": [["HF_TOKEN"]]}` | fromJson -}}
{{- /* end generated */ -}}
{{- $dest := "" -}}
{{- with .Values.config.export }}{{ $dest = .destination | default "" }}{{ end -}}
{{- $scheme := regexFind "^[a-z0-9]+" $dest -}}
{{- $env := .Values.secretEnv | default dict -}}
{{- with get $sets $scheme -}}
{{- $ok := false -}}
{{- range . -}}
{{- $all := true -}}
{{- range . }}{{ if not (hasKey $env .) }}{{ $all = false }}{{ end }}{{ end -}}
{{- if $all }}{{ $ok = true }}{{ end -}}
{{- end -}}
{{- $hub := eq $scheme "hf" -}}
{{- if and (not $ok) (or $hub (not $.Values.serviceAccount.name)) -}}
{{- $ways := list -}}
{{- range . }}{{ $ways = append $ways (join " and " .) }}{{ end -}}
{{- if $hub -}}
{{- fail (printf "config.export.destination %s needs HF_TOKEN (a token with write access) in the pods: set secretEnv.HF_TOKEN: {secret: SECRET, key: KEY}" $dest) -}}
{{- else -}}
{{- fail (printf "config.export.destination %s needs credentials in the pods: set secretEnv %s (each {secret: SECRET, key: KEY}), or serviceAccount.name bound to a cloud role (workload identity)" $dest (join "; or " $ways)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
