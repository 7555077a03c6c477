// Command gpu-webhook-peer is the benchmark's yardstick: the GPU rules of gpu-webhook's default policy,
// written the way a controller-runtime user writes an admission webhook (webhook.NewServer, admission.Webhook
// handlers, the Pod decoded into the k8s.io/api types by admission.Decoder, the patch computed by
// admission.PatchResponseFromRaw). It is not a product: see README.md for what it implements and what not.
//
//	gpu-webhook-peer -port 9443 -cert-dir DIR [-cert-name tls.crt] [-key-name tls.key]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager/signals"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// policy is gpu-webhook's policy reduced to the settings its default exercises (webhook/policy.py DEFAULTS).
type policy struct {
	resources    []string // exact names, or a prefix followed by '*'
	nodeLabel    string
	annotation   string
	allowed      []string // empty: any accelerator
	accelerator  string   // injected when the pod names none; empty: none
	perContainer int64    // 0: no cap
	perPod       int64    // 0: no cap
}

func defaultPolicy() *policy {
	return &policy{
		resources:  []string{"nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/*", "nvidia.com/mig-*"},
		nodeLabel:  "accelerator",
		annotation: "gpu-webhook/accelerator",
	}
}

func (p *policy) isGPU(name corev1.ResourceName) bool {
	for _, pattern := range p.resources {
		if prefix, glob := strings.CutSuffix(pattern, "*"); glob {
			if strings.HasPrefix(string(name), prefix) {
				return true
			}
		} else if string(name) == pattern {
			return true
		}
	}
	return false
}

func (p *policy) allows(accelerator string) bool {
	return len(p.allowed) == 0 || slices.Contains(p.allowed, accelerator)
}

// gpuNames are the GPU resources of a list, sorted so that messages come out in one order.
func (p *policy) gpuNames(list corev1.ResourceList) []corev1.ResourceName {
	var names []corev1.ResourceName
	for name := range list {
		if p.isGPU(name) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

const ceiling = 1_000_000 // as webhook/quantity.py: above this a count is a typo or an attack

// gpuCount is the whole, non-negative number of devices q stands for, or why it is none.
func gpuCount(q resource.Quantity) (int64, string) {
	if q.Sign() < 0 {
		return 0, "is negative (GPU counts are zero or more)"
	}
	if q.Cmp(*resource.NewQuantity(ceiling, resource.DecimalSI)) > 0 {
		return 0, fmt.Sprintf("is not a sensible GPU count (at most %d)", ceiling)
	}
	n := q.Value() // rounded up
	if q.Cmp(*resource.NewQuantity(n, resource.DecimalSI)) != 0 {
		return 0, "is not a whole number (GPUs cannot be shared)"
	}
	return n, ""
}

// containerGPUs is what one container asks for, requests defaulted from limits.
type containerGPUs struct {
	counts  map[corev1.ResourceName]int64
	named   bool // names a GPU resource, valid or not
	sidecar bool
}

func (p *policy) checkContainer(name string, res *corev1.ResourceRequirements, path *field.Path) (containerGPUs, field.ErrorList) {
	var errs field.ErrorList
	gpus := containerGPUs{counts: map[corev1.ResourceName]int64{}}
	label := fmt.Sprintf("container %q", name)
	limitsPath, requestsPath := path.Child("resources", "limits"), path.Child("resources", "requests")
	limits := map[corev1.ResourceName]int64{}
	for _, n := range p.gpuNames(res.Limits) {
		gpus.named = true
		q := res.Limits[n]
		count, bad := gpuCount(q)
		if bad != "" {
			errs = append(errs, field.Invalid(limitsPath.Key(string(n)), q.String(), label+": "+bad))
			continue
		}
		limits[n] = count
	}
	for _, n := range p.gpuNames(res.Requests) {
		gpus.named = true
		q := res.Requests[n]
		where := requestsPath.Key(string(n))
		count, bad := gpuCount(q)
		if bad != "" {
			errs = append(errs, field.Invalid(where, q.String(), label+": "+bad))
		}
		limit, hasLimit := res.Limits[n]
		limitCount, limitValid := limits[n]
		switch {
		case !hasLimit:
			errs = append(errs, field.Invalid(where, q.String(), fmt.Sprintf(
				"%s: %s is requested without a limit, set it in limits (requests default to limits)", label, n)))
		case bad == "" && limitValid && count != limitCount:
			errs = append(errs, field.Invalid(where, q.String(), fmt.Sprintf(
				"%s: %s requests (%s) must equal limits (%s)", label, n, q.String(), limit.String())))
		}
		if bad == "" {
			gpus.counts[n] = count
		}
	}
	for n, count := range limits {
		if _, ok := gpus.counts[n]; !ok {
			gpus.counts[n] = count
		}
		if p.perContainer > 0 && count > p.perContainer {
			errs = append(errs, field.Invalid(limitsPath.Key(string(n)), count, fmt.Sprintf(
				"%s: over the limit of %d per container", label, p.perContainer)))
		}
	}
	// Whole GPUs and MIG slices in one container: the device plugin serves one or the other.
	if _, whole := gpus.counts["nvidia.com/gpu"]; whole {
		for n := range gpus.counts {
			if strings.HasPrefix(string(n), "nvidia.com/mig-") {
				errs = append(errs, field.Forbidden(path.Child("resources"),
					label+" mixes nvidia.com/gpu with MIG slices"))
				break
			}
		}
	}
	return gpus, errs
}

// podTotals are the GPUs a pod holds at its peak, counted as the scheduler counts them.
func podTotals(app, init []containerGPUs) map[corev1.ResourceName]int64 {
	totals := map[corev1.ResourceName]int64{}
	for _, c := range app {
		for n, v := range c.counts {
			totals[n] += v
		}
	}
	sidecars, peak := map[corev1.ResourceName]int64{}, map[corev1.ResourceName]int64{}
	for _, c := range init {
		for n, v := range c.counts {
			high := v + sidecars[n]
			if c.sidecar {
				totals[n] += v
				sidecars[n] += v
				high = sidecars[n]
			}
			peak[n] = max(peak[n], high)
		}
	}
	for n, v := range peak {
		totals[n] = max(totals[n], v)
	}
	return totals
}

// template is a pod template found in an admitted object, and the path to it (nil for a Pod).
type template struct {
	meta *metav1.ObjectMeta
	spec *corev1.PodSpec
	path *field.Path
}

func child(base *field.Path, name string, more ...string) *field.Path {
	if base == nil {
		return field.NewPath(name, more...)
	}
	return base.Child(name, more...)
}

func (p *policy) checkPodSpec(t template) field.ErrorList {
	var errs field.ErrorList
	spec := t.spec
	specPath := child(t.path, "spec")
	used := false
	var app, init []containerGPUs
	for i := range spec.Containers {
		c := &spec.Containers[i]
		gpus, found := p.checkContainer(c.Name, &c.Resources, specPath.Child("containers").Index(i))
		errs, used, app = append(errs, found...), used || gpus.named, append(app, gpus)
	}
	for i := range spec.InitContainers {
		c := &spec.InitContainers[i]
		gpus, found := p.checkContainer(c.Name, &c.Resources, specPath.Child("initContainers").Index(i))
		gpus.sidecar = c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
		errs, used, init = append(errs, found...), used || gpus.named, append(init, gpus)
	}
	for i := range spec.EphemeralContainers {
		c := &spec.EphemeralContainers[i]
		path := specPath.Child("ephemeralContainers").Index(i)
		gpus, found := p.checkContainer(c.Name, &c.Resources, path)
		errs, used = append(errs, found...), used || gpus.named
		if len(gpus.counts) > 0 {
			errs = append(errs, field.Forbidden(path.Child("resources"), "ephemeral containers may not use GPUs"))
		}
	}
	if spec.Resources != nil {
		for kind, list := range map[string]corev1.ResourceList{"limits": spec.Resources.Limits, "requests": spec.Resources.Requests} {
			for _, n := range p.gpuNames(list) {
				errs = append(errs, field.Forbidden(specPath.Child("resources", kind).Key(string(n)),
					fmt.Sprintf("%s cannot be set in pod-level resources; set it on a container", n)))
			}
		}
	}
	if !used {
		return errs
	}
	if p.perPod > 0 {
		for n, v := range podTotals(app, init) {
			if v > p.perPod {
				errs = append(errs, field.Invalid(specPath, v, fmt.Sprintf(
					"pod asks for %d %s, over the limit of %d per pod", v, n, p.perPod)))
			}
		}
	}
	annotationPath := child(t.path, "metadata", "annotations").Key(p.annotation)
	selectorPath := specPath.Child("nodeSelector").Key(p.nodeLabel)
	annotated := t.meta.Annotations[p.annotation] // an empty annotation asks for nothing
	selected, hasSelector := spec.NodeSelector[p.nodeLabel]
	if annotated != "" && !p.allows(annotated) {
		errs = append(errs, field.NotSupported(annotationPath, annotated, p.allowed))
	}
	if hasSelector && !p.allows(selected) {
		errs = append(errs, field.NotSupported(selectorPath, selected, p.allowed))
	}
	if annotated != "" && hasSelector && annotated != selected {
		errs = append(errs, field.Invalid(annotationPath, annotated, fmt.Sprintf(
			"conflicts with nodeSelector %s=%s", p.nodeLabel, selected)))
	}
	return errs
}

// mutate gives pod its GPU defaults: requests copied from whole GPU limits, and the accelerator of
// the annotation (or the policy's) as a nodeSelector when the pod selects none. It reports a change.
func (p *policy) mutate(pod *corev1.Pod) bool {
	changed, used := false, false
	for _, containers := range [][]corev1.Container{pod.Spec.Containers, pod.Spec.InitContainers} {
		for i := range containers {
			res := &containers[i].Resources
			used = used || len(p.gpuNames(res.Requests)) > 0
			for _, n := range p.gpuNames(res.Limits) {
				used = true
				if _, set := res.Requests[n]; set {
					continue
				}
				if _, bad := gpuCount(res.Limits[n]); bad != "" {
					continue // /validate reports it
				}
				if res.Requests == nil {
					res.Requests = corev1.ResourceList{}
				}
				res.Requests[n] = res.Limits[n].DeepCopy()
				changed = true
			}
		}
	}
	if !used {
		return changed
	}
	value := pod.Annotations[p.annotation]
	if value == "" {
		value = p.accelerator
	}
	if value == "" || !p.allows(value) || affinityNames(pod.Spec.Affinity, p.nodeLabel) {
		return changed
	}
	if _, set := pod.Spec.NodeSelector[p.nodeLabel]; set {
		return changed
	}
	if pod.Spec.NodeSelector == nil {
		pod.Spec.NodeSelector = map[string]string{}
	}
	pod.Spec.NodeSelector[p.nodeLabel] = value
	return true
}

func affinityNames(affinity *corev1.Affinity, label string) bool {
	if affinity == nil || affinity.NodeAffinity == nil || affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return false
	}
	for _, term := range affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		for _, expr := range term.MatchExpressions {
			if expr.Key == label {
				return true
			}
		}
	}
	return false
}

// validator is the /validate handler.
type validator struct {
	decoder admission.Decoder
	policy  *policy
}

func (v *validator) Handle(_ context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create {
		return admission.Allowed("") // UPDATE is not checked: see README.md
	}
	t, err := v.template(req)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	if t == nil {
		return admission.Allowed("")
	}
	errs := v.policy.checkPodSpec(*t)
	if len(errs) == 0 {
		return admission.Allowed("")
	}
	return admission.Denied(fmt.Sprintf("%d GPU violation(s): %s", len(errs), errs.ToAggregate().Error()))
}

// template decodes the object of the built-in kinds that carry a pod template; nil for any other kind.
func (v *validator) template(req admission.Request) (*template, error) {
	decode := func(obj runtime.Object) error { return v.decoder.Decode(req, obj) }
	spec := field.NewPath("spec")
	switch req.Kind.Group + "/" + req.Kind.Kind {
	case "/Pod":
		obj := &corev1.Pod{}
		return &template{&obj.ObjectMeta, &obj.Spec, nil}, decode(obj)
	case "/PodTemplate":
		obj := &corev1.PodTemplate{}
		return &template{&obj.Template.ObjectMeta, &obj.Template.Spec, field.NewPath("template")}, decode(obj)
	case "/ReplicationController":
		obj := &corev1.ReplicationController{}
		if err := decode(obj); err != nil || obj.Spec.Template == nil {
			return nil, err
		}
		return &template{&obj.Spec.Template.ObjectMeta, &obj.Spec.Template.Spec, spec.Child("template")}, nil
	case "apps/Deployment":
		obj := &appsv1.Deployment{}
		return &template{&obj.Spec.Template.ObjectMeta, &obj.Spec.Template.Spec, spec.Child("template")}, decode(obj)
	case "apps/ReplicaSet":
		obj := &appsv1.ReplicaSet{}
		return &template{&obj.Spec.Template.ObjectMeta, &obj.Spec.Template.Spec, spec.Child("template")}, decode(obj)
	case "apps/StatefulSet":
		obj := &appsv1.StatefulSet{}
		return &template{&obj.Spec.Template.ObjectMeta, &obj.Spec.Template.Spec, spec.Child("template")}, decode(obj)
	case "apps/DaemonSet":
		obj := &appsv1.DaemonSet{}
		return &template{&obj.Spec.Template.ObjectMeta, &obj.Spec.Template.Spec, spec.Child("template")}, decode(obj)
	case "batch/Job":
		obj := &batchv1.Job{}
		return &template{&obj.Spec.Template.ObjectMeta, &obj.Spec.Template.Spec, spec.Child("template")}, decode(obj)
	case "batch/CronJob":
		obj := &batchv1.CronJob{}
		t := &obj.Spec.JobTemplate.Spec.Template
		return &template{&t.ObjectMeta, &t.Spec, spec.Child("jobTemplate", "spec", "template")}, decode(obj)
	}
	return nil, nil
}

// mutator is the /mutate handler: new Pods only, never a denial for the rules (/validate's job).
type mutator struct {
	decoder admission.Decoder
	policy  *policy
}

func (m *mutator) Handle(_ context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create || req.Kind.Group != "" || req.Kind.Kind != "Pod" {
		return admission.Allowed("")
	}
	pod := &corev1.Pod{}
	if err := m.decoder.Decode(req, pod); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	if !m.policy.mutate(pod) {
		return admission.Allowed("") // a patch from the round trip alone would be noise
	}
	mutated, err := json.Marshal(pod)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	return admission.PatchResponseFromRaw(req.Object.Raw, mutated)
}

func main() {
	opts := webhook.Options{}
	flag.StringVar(&opts.Host, "host", "127.0.0.1", "address to listen on")
	flag.IntVar(&opts.Port, "port", webhook.DefaultPort, "port to listen on")
	flag.StringVar(&opts.CertDir, "cert-dir", "", "directory holding the serving certificate and key")
	flag.StringVar(&opts.CertName, "cert-name", "tls.crt", "certificate file in -cert-dir")
	flag.StringVar(&opts.KeyName, "key-name", "tls.key", "key file in -cert-dir")
	logOpts := zap.Options{}
	logOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	logf.SetLogger(zap.New(zap.UseFlagOptions(&logOpts)))
	log := logf.Log.WithName("gpu-webhook-peer")

	scheme := runtime.NewScheme()
	utilruntime.Must(corev1.AddToScheme(scheme))
	utilruntime.Must(appsv1.AddToScheme(scheme))
	utilruntime.Must(batchv1.AddToScheme(scheme))
	decoder := admission.NewDecoder(scheme)
	rules := defaultPolicy()

	opts.WebhookMux = http.NewServeMux()
	opts.WebhookMux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	server := webhook.NewServer(opts)
	server.Register("/validate", &admission.Webhook{Handler: &validator{decoder, rules}})
	server.Register("/mutate", &admission.Webhook{Handler: &mutator{decoder, rules}})
	// The floor, as the Python server's /noop: the same decode and encode, no decision.
	server.Register("/noop", &admission.Webhook{Handler: admission.HandlerFunc(
		func(context.Context, admission.Request) admission.Response { return admission.Allowed("") })})
	if err := server.Start(signals.SetupSignalHandler()); err != nil {
		log.Error(err, "webhook server stopped")
		os.Exit(1)
	}
}
