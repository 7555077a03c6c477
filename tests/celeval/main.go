// celeval: the generated admission policies evaluated by the apiserver's own admission CEL packages
// (k8s.io/apiserver's validating and mutating policy plugins), without a kube-apiserver.
//
// It reads one JSON document on stdin:
//
//	{"compatibility": "1.29",            // the CEL environment new expressions get on that apiserver (its minor - 1)
//	 "objects": [ ...ValidatingAdmissionPolicy, ...Binding, MutatingAdmissionPolicy, ...Binding ],
//	 "requests": [{"id": "...", "operation": "CREATE", "namespace": "ns", "name": "x",
//	               "kind": {"group": "", "version": "v1", "kind": "Pod"},
//	               "resource": {"group": "", "version": "v1", "resource": "pods"},
//	               "object": {...}, "oldObject": {...} or null,
//	               "paramsUnavailable": true | "unsynced" | "unknown"}],   // optional, overrides the top-level one
//	 "paramKinds": [{"apiVersion": "example.com/v1", "kind": "Limits", "scope": "Namespaced" | "Cluster"}],
//	 "paramsUnavailable": true | "unsynced" | "unknown",               // optional, every request
//	 "cost": true}                        // optional: read each policy's CEL cost (a second evaluation)
//
// and writes one JSON document: each expression that does not compile in that environment, and per request
// what the apiserver's admission would do with it: the MutatingAdmissionPolicies first (reinvocation aside), then
// the ValidatingAdmissionPolicies on the mutated object, each through its bindings (resource rules, operations,
// and a namespaceSelector read against the namespace's kubernetes.io/metadata.name label), with the messages,
// warnings and (when asked) the CEL cost the apiserver would have.
//
// Params, as the apiserver's dispatchers collect them (k8s.io/apiserver generic.CollectParams): the objects of
// "objects" outside admissionregistration.k8s.io are the cluster's other objects; those whose apiVersion and kind
// are a policy's paramKind are its params (cluster-scoped when they have no metadata.namespace). A param kind's
// scope is read from its objects; "paramKinds" declares it for a kind without objects (default Namespaced, as a
// CRD's). A binding's paramRef picks by name (one object) or selector (each match, each evaluated); with no
// namespace, a namespaced kind is looked up in the request's namespace (a cluster-scoped request: a configuration
// error). A policy without paramKind ignores its binding's paramRef; a binding without paramRef evaluates with
// params null. No param found: parameterNotFoundAction Deny is a configuration error, otherwise the binding is
// skipped, shown as a decision with evaluation "skipped" (validating bindings; a skipped mutating binding just
// does not mutate). Configuration errors go through the policy's failurePolicy as the dispatchers do: Fail refuses
// with the apiserver's message (whatever the binding's validationActions), Ignore admits; either way a validating
// one shows as a decision with evaluation "error", a mutating one in "errors". "paramsUnavailable" stands for the
// param informer's troubles: true or "unsynced", the kind not yet synced (an error of each binding with a
// paramRef); "unknown", the kind has no resource (an error of the policy itself). Each validating decision made
// with a param names it in "param" ("namespace/name" or "name").
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"sort"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/policy/mutating/patch"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/cel/environment"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"
)

type input struct {
	Compatibility string                   `json:"compatibility"`
	Repeat        int                      `json:"repeat"` // admit each request this many times, for its time
	Objects       []map[string]interface{} `json:"objects"`
	Requests      []request                `json:"requests"`
	ParamKinds    []paramKindScope         `json:"paramKinds"`        // the scope of a param kind without objects
	Unavailable   unavailable              `json:"paramsUnavailable"` // the param informers' trouble, every request
	Cost          bool                     `json:"cost"`              // read each policy's CEL cost (evaluates again)
}

type paramKindScope struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Scope      string `json:"scope"` // Namespaced or Cluster
}

// unavailable: "" (params as the objects say), "unsynced" (the param kind's informer has not synced) or "unknown"
// (the param kind has no resource); JSON true is "unsynced".
type unavailable string

func (u *unavailable) UnmarshalJSON(data []byte) error {
	var flag bool
	if json.Unmarshal(data, &flag) == nil {
		*u = ""
		if flag {
			*u = "unsynced"
		}
		return nil
	}
	var s string
	if err := json.Unmarshal(data, &s); err != nil || (s != "" && s != "unsynced" && s != "unknown") {
		return fmt.Errorf(`paramsUnavailable: true, false, "unsynced" or "unknown", not %s`, data)
	}
	*u = unavailable(s)
	return nil
}

type request struct {
	ID        string                      `json:"id"`
	Operation string                      `json:"operation"`
	Namespace string                      `json:"namespace"`
	Name      string                      `json:"name"`
	Kind      metav1.GroupVersionKind     `json:"kind"`
	Resource  metav1.GroupVersionResource `json:"resource"`
	Object    map[string]interface{}      `json:"object"`
	OldObject map[string]interface{}      `json:"oldObject"`
	// Unavailable: the param informers' trouble for this request (overrides the top-level one when set).
	Unavailable unavailable `json:"paramsUnavailable"`
}

type compileError struct {
	Policy     string `json:"policy"`
	Expression string `json:"expression"` // where: "variables[2] name", "validations[0].expression", ...
	Error      string `json:"error"`
}

type decision struct {
	Policy     string `json:"policy"`
	Binding    string `json:"binding"`
	Evaluation string `json:"evaluation"` // admit, deny, error; skipped: no param found (parameterNotFoundAction Allow)
	Message    string `json:"message,omitempty"`
	Param      string `json:"param,omitempty"` // the param evaluated with: "namespace/name", or "name" (cluster-scoped)
}

type result struct {
	ID        string                 `json:"id"`
	Allowed   bool                   `json:"allowed"`
	Message   string                 `json:"message,omitempty"` // the apiserver's refusal, as the client reads it
	Warnings  []string               `json:"warnings"`
	Decisions []decision             `json:"decisions"`
	Decoded   map[string]interface{} `json:"decoded,omitempty"` // a built-in object as the apiserver decoded it
	Mutated   map[string]interface{} `json:"mutated,omitempty"` // the object after the mutating policies, if one patched it
	Errors    []string               `json:"errors"`            // mutations that failed (failurePolicy applied)
	Cost      map[string]int64       `json:"cost"`              // CEL cost per policy (validations and messages)
	Nanos     int64                  `json:"nanos,omitempty"`   // with repeat: mean wall time of one admission
}

type output struct {
	Compatibility string         `json:"compatibility"`
	CompileErrors []compileError `json:"compileErrors"`
	Results       []result       `json:"results"`
}

func main() {
	// CELEVAL_PROFILE=file: a CPU profile of the run (go tool pprof), to see what a policy's evaluation spends on.
	if path := os.Getenv("CELEVAL_PROFILE"); path != "" {
		f, err := os.Create(path)
		if err == nil && pprof.StartCPUProfile(f) == nil {
			defer pprof.StopCPUProfile()
		}
	}
	if err := run(os.Stdin, os.Stdout); err != nil {
		pprof.StopCPUProfile()
		fmt.Fprintln(os.Stderr, "celeval:", err)
		os.Exit(2)
	}
}

func run(in io.Reader, out io.Writer) error {
	raw, err := io.ReadAll(in)
	if err != nil {
		return err
	}
	var doc input
	// As the apiserver decodes an object: whole JSON numbers are int64, not float64.
	if err := utiljson.Unmarshal(raw, &doc); err != nil {
		return fmt.Errorf("input: %w", err)
	}
	compat := environment.DefaultCompatibilityVersion()
	if doc.Compatibility != "" {
		if compat, err = version.ParseMajorMinor(doc.Compatibility); err != nil {
			return fmt.Errorf("compatibility: %w", err)
		}
	}
	set, err := load(doc.Objects, environment.MustBaseEnvSet(compat))
	if err != nil {
		return err
	}
	if err := set.scopeParams(doc.ParamKinds); err != nil {
		return err
	}
	set.unavailable = doc.Unavailable
	readCost = doc.Cost
	res := output{Compatibility: fmt.Sprintf("%d.%d", compat.Major(), compat.Minor()), CompileErrors: set.errors,
		Results: []result{}}
	for _, r := range doc.Requests {
		got := set.admit(r)
		if doc.Repeat > 0 {
			timing = true // the timed admissions leave out the cost, read by evaluating again
			start := time.Now()
			for i := 0; i < doc.Repeat; i++ {
				set.admit(r)
			}
			got.Nanos = time.Since(start).Nanoseconds() / int64(doc.Repeat)
			timing = false
		}
		res.Results = append(res.Results, got)
	}
	enc := json.NewEncoder(out)
	enc.SetEscapeHTML(false)
	return enc.Encode(res)
}

// --- compiling -------------------------------------------------------------------------------------------

type vap struct {
	policy      *admissionregistrationv1.ValidatingAdmissionPolicy
	validator   validating.Validator
	validations plugincel.ConditionEvaluator // the same expressions again, to read their CEL cost
	messages    plugincel.ConditionEvaluator
}

type mapolicy struct {
	policy   *admissionregistrationv1.MutatingAdmissionPolicy
	compiler *plugincel.CompositedCompiler // its variables: each evaluation reads them through a fresh context
	matcher  matchconditions.Matcher
	patchers []patch.Patcher
}

type policySet struct {
	vaps        []vap
	vapBindings []*admissionregistrationv1.ValidatingAdmissionPolicyBinding
	maps        []mapolicy
	mapBindings []*admissionregistrationv1.MutatingAdmissionPolicyBinding
	errors      []compileError
	params      map[string][]param // the objects of each kind (kindKey) outside admissionregistration.k8s.io
	clusterKind map[string]bool    // the param kinds that are cluster-scoped
	unavailable unavailable
}

// param: an object a binding's paramRef may pick, in the two forms the apiserver's dispatchers pass to CEL.
type param struct {
	namespace, name string
	labels          labels.Set
	// informer: as the param informer serves it (a built-in kind typed and without apiVersion/kind, as the
	// mutating dispatcher passes it); typed: with apiVersion and kind, as the validating dispatcher wraps it.
	informer, typed runtime.Object
}

func (p param) key() string {
	if p.namespace == "" {
		return p.name
	}
	return p.namespace + "/" + p.name
}

func kindKey(apiVersion, kind string) string { return apiVersion + ", Kind=" + kind }

func newParam(obj map[string]interface{}, apiVersion, kind string) (param, error) {
	u := &unstructured.Unstructured{Object: obj}
	p := param{namespace: u.GetNamespace(), name: u.GetName(), labels: labels.Set(u.GetLabels()), informer: u, typed: u}
	gv, err := schema.ParseGroupVersion(apiVersion)
	if err != nil {
		return p, err
	}
	if typed, err := clientgoscheme.Scheme.New(gv.WithKind(kind)); err == nil {
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj, typed); err != nil {
			return p, err
		}
		typed.GetObjectKind().SetGroupVersionKind(schema.GroupVersionKind{})
		wrapped, err := runtime.DefaultUnstructuredConverter.ToUnstructured(typed)
		if err != nil {
			return p, err
		}
		wrapped["apiVersion"], wrapped["kind"] = apiVersion, kind
		p.informer, p.typed = typed, &unstructured.Unstructured{Object: wrapped}
	}
	return p, nil
}

// scopeParams: each param kind's scope, from its objects (all namespaced or all not) or as declared.
func (s *policySet) scopeParams(declared []paramKindScope) error {
	s.clusterKind = map[string]bool{}
	for _, d := range declared {
		if d.Scope != "Namespaced" && d.Scope != "Cluster" {
			return fmt.Errorf("paramKinds: %s %s: scope Namespaced or Cluster, not %q", d.APIVersion, d.Kind, d.Scope)
		}
		s.clusterKind[kindKey(d.APIVersion, d.Kind)] = d.Scope == "Cluster"
	}
	for key, objects := range s.params {
		namespaced := 0
		for _, p := range objects {
			if p.namespace != "" {
				namespaced++
			}
		}
		cluster := namespaced == 0
		if namespaced != 0 && namespaced != len(objects) {
			return fmt.Errorf("objects of %s: some namespaced and some not", key)
		}
		if declared, ok := s.clusterKind[key]; ok && declared != cluster {
			return fmt.Errorf("paramKinds: %s: the scope declared is not its objects'", key)
		}
		s.clusterKind[key] = cluster
	}
	return nil
}

// collectParams: the params of one binding of a policy, as generic.CollectParams finds them: a nil param when
// the policy has no paramKind or the binding no paramRef; none when none is found and the binding allows that.
func (s *policySet) collectParams(kind *admissionregistrationv1.ParamKind, ref *admissionregistrationv1.ParamRef,
	namespace string, trouble unavailable) ([]param, error) {
	if kind == nil || ref == nil {
		return []param{{}}, nil
	}
	key := kindKey(kind.APIVersion, kind.Kind)
	cluster := s.clusterKind[key]
	in := ""
	if !cluster {
		in = namespace
		if ref.Namespace != "" {
			in = ref.Namespace
		} else if in == "" {
			return nil, errors.New("cannot use namespaced paramRef in policy binding that matches cluster-scoped resources")
		}
	}
	if trouble == "unsynced" {
		return nil, fmt.Errorf("paramKind kind `%v` not yet synced to use for admission", kind.String())
	}
	var found []param
	switch {
	case ref.Namespace != "" && cluster:
		return nil, errors.New("paramRef.namespace must not be provided for a cluster-scoped `paramKind`")
	case ref.Name != "":
		if ref.Selector != nil {
			return nil, errors.New("paramRef.name and paramRef.selector are mutually exclusive")
		}
		for _, p := range s.params[key] {
			if p.namespace == in && p.name == ref.Name {
				found = []param{p}
			}
		}
	case ref.Selector != nil:
		selector, err := metav1.LabelSelectorAsSelector(ref.Selector)
		if err != nil {
			return nil, err
		}
		for _, p := range s.params[key] {
			if p.namespace == in && selector.Matches(p.labels) {
				found = append(found, p)
			}
		}
		sort.Slice(found, func(i, j int) bool { return found[i].key() < found[j].key() })
	default:
		return nil, errors.New("one of name or selector must be provided")
	}
	if len(found) == 0 && ref.ParameterNotFoundAction != nil &&
		*ref.ParameterNotFoundAction == admissionregistrationv1.DenyAction {
		return nil, errors.New("no params found for policy binding with `Deny` parameterNotFoundAction")
	}
	return found, nil
}

// unknownParamKind: the configuration error of a policy whose paramKind has no resource.
func unknownParamKind(kind *admissionregistrationv1.ParamKind) error {
	gv, _ := schema.ParseGroupVersion(kind.APIVersion)
	return fmt.Errorf("failed to find resource referenced by paramKind: '%v'", gv.WithKind(kind.Kind))
}

func fails(policy *admissionregistrationv1.FailurePolicyType) bool {
	return policy == nil || *policy != admissionregistrationv1.Ignore
}

func convert(obj map[string]interface{}, into interface{}) error {
	data, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	// sigs.k8s.io/yaml's JSON path is strict about unknown fields: a typo in a generated object shows here.
	return yaml.UnmarshalStrict(data, into)
}

func load(objects []map[string]interface{}, envs *environment.EnvSet) (*policySet, error) {
	set := &policySet{errors: []compileError{}, params: map[string][]param{}}
	for _, obj := range objects {
		kind, _ := obj["kind"].(string)
		apiVersion, _ := obj["apiVersion"].(string)
		if !strings.HasPrefix(apiVersion, "admissionregistration.k8s.io/") {
			// Another object of the cluster: a param, if a policy's paramKind names its kind.
			p, err := newParam(obj, apiVersion, kind)
			if err != nil || apiVersion == "" || kind == "" || p.name == "" {
				return nil, fmt.Errorf("%s %s %q: not an object a param can be (%v)", apiVersion, kind, p.name, err)
			}
			set.params[kindKey(apiVersion, kind)] = append(set.params[kindKey(apiVersion, kind)], p)
			continue
		}
		// v1beta1 MutatingAdmissionPolicies carry the same fields as v1: read both into the v1 types.
		switch kind {
		case "ValidatingAdmissionPolicy":
			p := &admissionregistrationv1.ValidatingAdmissionPolicy{}
			if err := convert(obj, p); err != nil {
				return nil, fmt.Errorf("%s: %w", kind, err)
			}
			set.vaps = append(set.vaps, compileVAP(p, envs, &set.errors))
		case "ValidatingAdmissionPolicyBinding":
			b := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
			if err := convert(obj, b); err != nil {
				return nil, fmt.Errorf("%s: %w", kind, err)
			}
			set.vapBindings = append(set.vapBindings, b)
		case "MutatingAdmissionPolicy":
			p := &admissionregistrationv1.MutatingAdmissionPolicy{}
			if err := convert(obj, p); err != nil {
				return nil, fmt.Errorf("%s: %w", kind, err)
			}
			set.maps = append(set.maps, compileMAP(p, envs, &set.errors))
		case "MutatingAdmissionPolicyBinding":
			b := &admissionregistrationv1.MutatingAdmissionPolicyBinding{}
			if err := convert(obj, b); err != nil {
				return nil, fmt.Errorf("%s: %w", kind, err)
			}
			set.mapBindings = append(set.mapBindings, b)
		default:
			return nil, fmt.Errorf("unexpected kind %q", kind)
		}
	}
	return set, nil
}

// noteErrors records each expression that did not compile, as the apiserver refuses the object at create.
func noteErrors(policy, where string, results []plugincel.CompilationResult, errs *[]compileError) {
	for _, r := range results {
		if r.Error != nil {
			*errs = append(*errs, compileError{policy, where, r.Error.Error()})
		}
	}
}

func compiler(envs *environment.EnvSet) *plugincel.CompositedCompiler {
	c, err := plugincel.NewCompositedCompiler(envs)
	if err != nil {
		panic(err) // the base environment always builds
	}
	return c
}

// mode: NewExpressions, the environment an apiserver checks a policy against when it is written.
const mode = environment.NewExpressions

func compileVariables(c *plugincel.CompositedCompiler, name string, vars []admissionregistrationv1.Variable,
	opts plugincel.OptionalVariableDeclarations, errs *[]compileError) {
	for i, v := range vars {
		start := time.Now()
		r := c.CompileAndStoreVariable(&validating.Variable{Name: v.Name, Expression: v.Expression}, opts, mode)
		if os.Getenv("CELEVAL_COMPILE_TIMES") != "" {
			fmt.Fprintf(os.Stderr, "compile %s %s %d ms\n", name, v.Name, time.Since(start).Milliseconds())
		}
		noteErrors(name, fmt.Sprintf("variables[%d] %s", i, v.Name), []plugincel.CompilationResult{r}, errs)
	}
}

func compileVAP(p *admissionregistrationv1.ValidatingAdmissionPolicy, envs *environment.EnvSet,
	errs *[]compileError) vap {
	opts := plugincel.OptionalVariableDeclarations{HasParams: p.Spec.ParamKind != nil}
	c := compiler(envs)
	compileVariables(c, p.Name, p.Spec.Variables, opts, errs)
	matcher := compileMatcher(c, p.Name, p.Spec.MatchConditions, p.Spec.FailurePolicy, "validate", opts, errs)
	validations := make([]plugincel.ExpressionAccessor, len(p.Spec.Validations))
	messages := make([]plugincel.ExpressionAccessor, len(p.Spec.Validations))
	for i, v := range p.Spec.Validations {
		validations[i] = &validating.ValidationCondition{Expression: v.Expression, Message: v.Message, Reason: v.Reason}
		if v.MessageExpression != "" {
			messages[i] = &validating.MessageExpressionCondition{MessageExpression: v.MessageExpression}
		}
	}
	// Each list compiled once, shared by the validator and the cost reading; an expression is compiled alone
	// again only when its list has errors, to name it.
	validationsEval := c.CompileCondition(validations, opts, mode)
	messagesEval := c.CompileCondition(messages, opts, mode)
	if len(validationsEval.CompilationErrors())+len(messagesEval.CompilationErrors()) > 0 {
		for i := range p.Spec.Validations {
			check(c, p.Name, fmt.Sprintf("validations[%d].expression", i), validations[i], opts, errs)
			if messages[i] != nil {
				check(c, p.Name, fmt.Sprintf("validations[%d].messageExpression", i), messages[i], opts, errs)
			}
		}
	}
	validator := validating.NewValidator(validationsEval, matcher, c.CompileCondition(nil, opts, mode), messagesEval,
		p.Spec.FailurePolicy, nil)
	return vap{p, validator, validationsEval, messagesEval}
}

// compileMatcher: the policy's matchConditions compiled once (nil when it has none); each alone again only when
// they have errors, to name the one that failed.
func compileMatcher(c *plugincel.CompositedCompiler, policy string, conditions []admissionregistrationv1.MatchCondition,
	failurePolicy *admissionregistrationv1.FailurePolicyType, kind string, opts plugincel.OptionalVariableDeclarations,
	errs *[]compileError) matchconditions.Matcher {
	if len(conditions) == 0 {
		return nil
	}
	accessors := make([]plugincel.ExpressionAccessor, len(conditions))
	for i := range conditions {
		accessors[i] = (*matchconditions.MatchCondition)(&conditions[i])
	}
	compiled := c.CompileCondition(accessors, opts, mode)
	if len(compiled.CompilationErrors()) > 0 {
		for i := range accessors {
			check(c, policy, fmt.Sprintf("matchConditions[%d]", i), accessors[i], opts, errs)
		}
	}
	return matchconditions.NewMatcher(compiled, failurePolicy, "policy", kind, policy)
}

func compileMAP(p *admissionregistrationv1.MutatingAdmissionPolicy, envs *environment.EnvSet,
	errs *[]compileError) mapolicy {
	opts := plugincel.OptionalVariableDeclarations{HasParams: p.Spec.ParamKind != nil}
	c := compiler(envs)
	compileVariables(c, p.Name, p.Spec.Variables, opts, errs)
	out := mapolicy{policy: p, compiler: c}
	out.matcher = compileMatcher(c, p.Name, p.Spec.MatchConditions, p.Spec.FailurePolicy, "mutate", opts, errs)
	patchOpts := opts
	patchOpts.HasPatchTypes = true
	for i, m := range p.Spec.Mutations {
		switch {
		case m.PatchType == admissionregistrationv1.PatchTypeJSONPatch && m.JSONPatch != nil:
			a := &patch.JSONPatchCondition{Expression: m.JSONPatch.Expression}
			evaluator := c.CompileMutatingEvaluator(a, patchOpts, mode)
			for _, e := range evaluator.CompilationErrors() {
				*errs = append(*errs, compileError{p.Name, fmt.Sprintf("mutations[%d]", i), e.Error()})
			}
			out.patchers = append(out.patchers, patch.NewJSONPatcher(evaluator))
		case m.PatchType == admissionregistrationv1.PatchTypeApplyConfiguration && m.ApplyConfiguration != nil:
			a := &patch.ApplyConfigurationCondition{Expression: m.ApplyConfiguration.Expression}
			evaluator := c.CompileMutatingEvaluator(a, patchOpts, mode)
			for _, e := range evaluator.CompilationErrors() {
				*errs = append(*errs, compileError{p.Name, fmt.Sprintf("mutations[%d]", i), e.Error()})
			}
			out.patchers = append(out.patchers, patch.NewApplyConfigurationPatcher(evaluator))
		}
	}
	return out
}

// check compiles one expression alone, only to name it when it fails (CompileCondition keeps errors per list).
func check(c *plugincel.CompositedCompiler, policy, where string, a plugincel.ExpressionAccessor,
	opts plugincel.OptionalVariableDeclarations, errs *[]compileError) {
	for _, err := range c.CompileCondition([]plugincel.ExpressionAccessor{a}, opts, mode).CompilationErrors() {
		*errs = append(*errs, compileError{policy, where, err.Error()})
	}
}

// --- admitting ------------------------------------------------------------------------------------------------

func matchesRules(rules []admissionregistrationv1.NamedRuleWithOperations, r request) bool {
	for _, rule := range rules {
		if ruleMatches(rule.RuleWithOperations, r) {
			return true
		}
	}
	return false
}

func has(list []string, value string) bool {
	for _, v := range list {
		if v == "*" || v == value {
			return true
		}
	}
	return false
}

func ruleMatches(rule admissionregistrationv1.RuleWithOperations, r request) bool {
	ops := make([]string, len(rule.Operations))
	for i, o := range rule.Operations {
		ops[i] = string(o)
	}
	if !has(ops, r.Operation) || !has(rule.APIGroups, r.Resource.Group) ||
		!has(rule.APIVersions, r.Resource.Version) || !has(rule.Resources, r.Resource.Resource) {
		return false
	}
	return rule.Scope == nil || *rule.Scope == admissionregistrationv1.AllScopes ||
		(*rule.Scope == admissionregistrationv1.NamespacedScope) == (r.Namespace != "")
}

func namespaceLabels(ns string) labels.Set {
	return labels.Set{"kubernetes.io/metadata.name": ns}
}

func selects(selector *metav1.LabelSelector, r request) bool {
	if selector == nil || r.Namespace == "" {
		return true
	}
	s, err := metav1.LabelSelectorAsSelector(selector)
	if err != nil {
		return false
	}
	return s.Matches(namespaceLabels(r.Namespace))
}

func objectSelects(selector *metav1.LabelSelector, obj map[string]interface{}) bool {
	if selector == nil {
		return true
	}
	s, err := metav1.LabelSelectorAsSelector(selector)
	if err != nil {
		return false
	}
	u := unstructured.Unstructured{Object: obj}
	return s.Matches(labels.Set(u.GetLabels()))
}

func resourcesMatch(m *admissionregistrationv1.MatchResources, r request, obj map[string]interface{}) bool {
	if m == nil {
		return true
	}
	if len(m.ResourceRules) > 0 && !matchesRules(m.ResourceRules, r) {
		return false
	}
	if len(m.ExcludeResourceRules) > 0 && matchesRules(m.ExcludeResourceRules, r) {
		return false
	}
	return selects(m.NamespaceSelector, r) && objectSelects(m.ObjectSelector, obj)
}

func attributes(r request, obj, old map[string]interface{}) *admission.VersionedAttributes {
	var object, oldObject runtime.Object
	if obj != nil {
		object = &unstructured.Unstructured{Object: obj}
	}
	if old != nil {
		oldObject = &unstructured.Unstructured{Object: old}
	}
	gvk := schema.GroupVersionKind{Group: r.Kind.Group, Version: r.Kind.Version, Kind: r.Kind.Kind}
	gvr := schema.GroupVersionResource{Group: r.Resource.Group, Version: r.Resource.Version,
		Resource: r.Resource.Resource}
	attrs := admission.NewAttributesRecord(object, oldObject, gvk, r.Namespace, r.Name, gvr, "",
		admission.Operation(r.Operation), nil, true, nil)
	return &admission.VersionedAttributes{Attributes: attrs, VersionedKind: gvk, VersionedObject: admission.NewLazyObject(object),
		VersionedOldObject: admission.NewLazyObject(oldObject)}
}

func namespaceObject(r request) *corev1.Namespace {
	if r.Namespace == "" {
		return nil
	}
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: r.Namespace, Labels: namespaceLabels(r.Namespace)}}
}

// readCost: the input asked for each policy's CEL cost, which takes a second evaluation; timing: admissions being
// timed skip that evaluation.
var readCost, timing bool

var objectInterfaces = admission.NewObjectInterfacesFromScheme(runtime.NewScheme())

func (s *policySet) admit(r request) result {
	res := result{ID: r.ID, Allowed: true, Warnings: []string{}, Decisions: []decision{}, Errors: []string{},
		Cost: map[string]int64{}}
	// A built-in kind reaches admission policies as the apiserver decoded, defaulted and validated it.
	if obj, refusal := decoded(r.Kind.Kind, r.Object); refusal != "" {
		res.Allowed, res.Message = false, refusal
		return res
	} else if obj != nil {
		r.Object = obj
		res.Decoded = obj
		if old, _ := decoded(r.Kind.Kind, r.OldObject); old != nil {
			r.OldObject = old
		}
	}
	ctx := context.Background()
	gvr := schema.GroupVersionResource{Group: r.Resource.Group, Version: r.Resource.Version,
		Resource: r.Resource.Resource}
	obj := r.Object
	ns := namespaceObject(r)
	trouble := s.unavailable
	if r.Unavailable != "" {
		trouble = r.Unavailable
	}
	// Mutating policies first, in order: as the generic dispatcher, the params of every matching binding are
	// collected (their configuration errors noted) before the invocations (policy, binding, param) run.
	type invocation struct {
		m       *mapolicy
		binding *admissionregistrationv1.MutatingAdmissionPolicyBinding
		param   runtime.Object
	}
	var invocations []invocation
	var refusals []string // the errors under failurePolicy Fail, in the dispatcher's order
	configError := func(m *mapolicy, binding string, err error) {
		var message string
		if binding == "" {
			message = fmt.Sprintf("policy %q denied request: failed to configure policy: %v", m.policy.Name, err)
		} else {
			message = fmt.Sprintf("policy '%s' with binding '%s' denied request: failed to configure binding: %v",
				m.policy.Name, binding, err)
		}
		res.Errors = append(res.Errors, fmt.Sprintf("%s: %s", m.policy.Name, message))
		if fails(m.policy.Spec.FailurePolicy) {
			refusals = append(refusals, message)
		}
	}
	for i := range s.maps {
		m := &s.maps[i]
		if !resourcesMatch(m.policy.Spec.MatchConstraints, r, obj) {
			continue
		}
		bound := false
		for _, b := range s.mapBindings {
			bound = bound || b.Spec.PolicyName == m.policy.Name
		}
		if bound && m.policy.Spec.ParamKind != nil && trouble == "unknown" {
			configError(m, "", unknownParamKind(m.policy.Spec.ParamKind))
			continue
		}
		for _, b := range s.mapBindings {
			if b.Spec.PolicyName != m.policy.Name || !resourcesMatch(b.Spec.MatchResources, r, obj) {
				continue
			}
			params, err := s.collectParams(m.policy.Spec.ParamKind, b.Spec.ParamRef, r.Namespace, trouble)
			if err != nil {
				configError(m, b.Name, err)
				continue
			}
			for _, p := range params {
				invocations = append(invocations, invocation{m, b, p.informer})
			}
		}
	}
	for _, inv := range invocations {
		m, b := inv.m, inv.binding
		va := attributes(r, obj, r.OldObject)
		if m.matcher != nil {
			matched := m.matcher.Match(ctx, va, inv.param, nil)
			if matched.Error != nil {
				res.Errors = append(res.Errors, fmt.Sprintf("%s: matchConditions: %v", m.policy.Name, matched.Error))
				continue
			}
			if !matched.Matches {
				continue
			}
		}
		// As the apiserver's dispatcher does: one composition context per policy evaluation.
		evalCtx := m.compiler.CreateContext(ctx)
		for _, p := range m.patchers {
			patched, err := p.Patch(evalCtx, patch.Request{MatchedResource: gvr, VersionedAttributes: va,
				ObjectInterfaces: objectInterfaces, Namespace: ns,
				OptionalVariables: plugincel.OptionalVariableBindings{VersionedParams: inv.param}},
				celconfig.RuntimeCELCostBudget)
			if err != nil {
				res.Errors = append(res.Errors, fmt.Sprintf("%s: %v", m.policy.Name, err))
				if fails(m.policy.Spec.FailurePolicy) {
					refusals = append(refusals, fmt.Sprintf("policy '%s' with binding '%s' denied request: %v",
						m.policy.Name, b.Name, err))
					res.Allowed, res.Message = false, refusals[0]
					return res
				}
				continue
			}
			u, ok := patched.(*unstructured.Unstructured)
			if !ok {
				res.Errors = append(res.Errors, fmt.Sprintf("%s: patched object of type %T", m.policy.Name, patched))
				continue
			}
			obj = u.Object
			va = attributes(r, obj, r.OldObject)
			res.Mutated = obj
		}
	}
	if len(refusals) > 0 {
		res.Allowed, res.Message = false, refusals[0]
		return res
	}
	// Then the validating policies on the (mutated) object.
	refuse := func(message string) {
		if res.Allowed {
			res.Allowed, res.Message = false, message
		}
	}
	for _, v := range s.vaps {
		if !resourcesMatch(v.policy.Spec.MatchConstraints, r, obj) {
			continue
		}
		names := []string{}
		for _, b := range s.vapBindings {
			if b.Spec.PolicyName == v.policy.Name {
				names = append(names, b.Name)
			}
		}
		sort.Strings(names)
		if len(names) > 0 && v.policy.Spec.ParamKind != nil && trouble == "unknown" {
			message := fmt.Sprintf("failed to configure policy: %v", unknownParamKind(v.policy.Spec.ParamKind))
			res.Decisions = append(res.Decisions, decision{Policy: v.policy.Name, Evaluation: "error", Message: message})
			if fails(v.policy.Spec.FailurePolicy) {
				refuse(fmt.Sprintf("ValidatingAdmissionPolicy '%s' denied request: %s", v.policy.Name, message))
			}
			continue
		}
		for _, name := range names {
			b := s.vapBinding(name)
			if !resourcesMatch(b.Spec.MatchResources, r, obj) {
				continue
			}
			params, err := s.collectParams(v.policy.Spec.ParamKind, b.Spec.ParamRef, r.Namespace, trouble)
			if err != nil {
				// A configuration error denies through failurePolicy alone, whatever the validationActions.
				message := fmt.Sprintf("failed to configure binding: %v", err)
				res.Decisions = append(res.Decisions, decision{Policy: v.policy.Name, Binding: b.Name,
					Evaluation: "error", Message: message})
				if fails(v.policy.Spec.FailurePolicy) {
					refuse(fmt.Sprintf("ValidatingAdmissionPolicy '%s' with binding '%s' denied request: %s",
						v.policy.Name, b.Name, message))
				}
				continue
			}
			if len(params) == 0 {
				res.Decisions = append(res.Decisions, decision{Policy: v.policy.Name, Binding: b.Name,
					Evaluation: "skipped", Message: "no params found; parameterNotFoundAction Allow"})
				continue
			}
			va := attributes(r, obj, r.OldObject)
			for _, p := range params {
				got := v.validator.Validate(ctx, gvr, va, p.typed, ns, celconfig.RuntimeCELCostBudget, nil)
				if len(got.Decisions) > 0 && readCost && !timing { // matchConditions let it through
					res.Cost[v.policy.Name] += v.cost(ctx, gvr, va, ns, p.typed)
				}
				for _, d := range got.Decisions {
					dec := decision{Policy: v.policy.Name, Binding: b.Name, Evaluation: string(d.Evaluation),
						Message: d.Message, Param: p.key()}
					res.Decisions = append(res.Decisions, dec)
					if d.Action == validating.ActionAdmit {
						continue
					}
					for _, action := range b.Spec.ValidationActions {
						switch action {
						case admissionregistrationv1.Deny:
							refuse(fmt.Sprintf("ValidatingAdmissionPolicy '%s' with binding '%s' denied request: %s",
								v.policy.Name, b.Name, d.Message))
						case admissionregistrationv1.Warn:
							res.Warnings = append(res.Warnings, fmt.Sprintf(
								"Validation failed for ValidatingAdmissionPolicy '%s' with binding '%s': %s",
								v.policy.Name, b.Name, d.Message))
						}
					}
				}
			}
		}
	}
	return res
}

// typed: the built-in kinds whose objects the apiserver decodes into their Go types before admission.
func typed(kind string) runtime.Object {
	switch kind {
	case "Pod":
		return &corev1.Pod{}
	case "PodTemplate":
		return &corev1.PodTemplate{}
	case "ReplicationController":
		return &corev1.ReplicationController{}
	case "Deployment":
		return &appsv1.Deployment{}
	case "ReplicaSet":
		return &appsv1.ReplicaSet{}
	case "StatefulSet":
		return &appsv1.StatefulSet{}
	case "DaemonSet":
		return &appsv1.DaemonSet{}
	case "Job":
		return &batchv1.Job{}
	case "CronJob":
		return &batchv1.CronJob{}
	}
	return nil
}

// decoded: a built-in object as an apiserver hands it to admission policies: decoded into its type (quantities in
// their canonical form), a Pod's missing requests defaulted from its limits, and refused (with a message naming
// the apiserver) when its extended resources break the rules the apiserver itself enforces (not whole, negative,
// requests without limits, requests unequal to limits). Not built in: (nil, "").
func decoded(kind string, obj map[string]interface{}) (map[string]interface{}, string) {
	into := typed(kind)
	if into == nil || obj == nil {
		return nil, ""
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj, into); err != nil {
		return nil, fmt.Sprintf("apiserver: the object does not decode: %v", err)
	}
	var specs []*corev1.PodSpec
	switch o := into.(type) {
	case *corev1.Pod:
		specs = append(specs, &o.Spec)
		for _, list := range [][]corev1.Container{o.Spec.Containers, o.Spec.InitContainers} {
			for i := range list {
				c := &list[i]
				for name, q := range c.Resources.Limits {
					if c.Resources.Requests == nil {
						c.Resources.Requests = corev1.ResourceList{}
					}
					if _, ok := c.Resources.Requests[name]; !ok {
						c.Resources.Requests[name] = q.DeepCopy()
					}
				}
			}
		}
	case *corev1.PodTemplate:
		specs = append(specs, &o.Template.Spec)
	case *corev1.ReplicationController:
		if o.Spec.Template != nil {
			specs = append(specs, &o.Spec.Template.Spec)
		}
	case *appsv1.Deployment:
		specs = append(specs, &o.Spec.Template.Spec)
	case *appsv1.ReplicaSet:
		specs = append(specs, &o.Spec.Template.Spec)
	case *appsv1.StatefulSet:
		specs = append(specs, &o.Spec.Template.Spec)
	case *appsv1.DaemonSet:
		specs = append(specs, &o.Spec.Template.Spec)
	case *batchv1.Job:
		specs = append(specs, &o.Spec.Template.Spec)
	case *batchv1.CronJob:
		specs = append(specs, &o.Spec.JobTemplate.Spec.Template.Spec)
	}
	for _, spec := range specs {
		for _, list := range [][]corev1.Container{spec.Containers, spec.InitContainers, containersOf(spec.EphemeralContainers)} {
			for _, c := range list {
				if problem := extendedProblem(c.Resources); problem != "" {
					return nil, fmt.Sprintf("apiserver: container %q: %s", c.Name, problem)
				}
			}
		}
	}
	out, err := runtime.DefaultUnstructuredConverter.ToUnstructured(into)
	if err != nil {
		return nil, fmt.Sprintf("apiserver: %v", err)
	}
	return out, ""
}

func containersOf(ephemeral []corev1.EphemeralContainer) []corev1.Container {
	out := make([]corev1.Container, len(ephemeral))
	for i, e := range ephemeral {
		out[i] = corev1.Container{Name: e.Name, Resources: e.Resources}
	}
	return out
}

// extendedProblem: what pkg/apis/core/validation refuses in a container's extended resources (names with a domain
// outside kubernetes.io): a count that is not whole or is negative, requests without limits, requests unequal to
// limits.
func extendedProblem(r corev1.ResourceRequirements) string {
	extended := func(name corev1.ResourceName) bool {
		n := string(name)
		return strings.Contains(n, "/") && !strings.HasPrefix(n, "kubernetes.io/") && !strings.HasPrefix(n, "requests.")
	}
	for _, list := range []corev1.ResourceList{r.Limits, r.Requests} {
		for name, q := range list {
			if extended(name) && (q.Sign() < 0 || q.MilliValue()%1000 != 0) {
				return fmt.Sprintf("%s must be a whole, non-negative number", name)
			}
		}
	}
	for name, q := range r.Requests {
		if !extended(name) {
			continue
		}
		limit, ok := r.Limits[name]
		if !ok {
			return fmt.Sprintf("%s: limit must be set for non overcommitable resources", name)
		}
		if limit.Cmp(q) != 0 {
			return fmt.Sprintf("%s: must be equal to %s limit", name, name)
		}
	}
	return ""
}

func (s *policySet) vapBinding(name string) *admissionregistrationv1.ValidatingAdmissionPolicyBinding {
	for _, b := range s.vapBindings {
		if b.Name == name {
			return b
		}
	}
	return nil
}

// cost: the CEL cost of the policy's validations and then its messages, each in a fresh activation as the
// apiserver's validator evaluates them (the validator itself does not report it). Zero when matchConditions skip.
func (v vap) cost(ctx context.Context, gvr schema.GroupVersionResource, va *admission.VersionedAttributes,
	ns *corev1.Namespace, param runtime.Object) int64 {
	request := plugincel.CreateAdmissionRequest(va.Attributes, metav1.GroupVersionResource(gvr),
		metav1.GroupVersionKind(va.VersionedKind))
	budget := int64(celconfig.RuntimeCELCostBudget)
	bindings := plugincel.OptionalVariableBindings{VersionedParams: param}
	_, left, err := v.validations.ForInput(ctx, va, request, bindings, ns, budget)
	if err != nil {
		return -1
	}
	_, rest, err := v.messages.ForInput(ctx, va, request, bindings, ns, left)
	if err != nil {
		return -1
	}
	return budget - rest
}
