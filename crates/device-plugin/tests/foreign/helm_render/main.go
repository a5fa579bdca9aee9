// SPDX-License-Identifier: Apache-2.0

// Command helm_render renders a Helm chart the way `helm template` does, from the
// engines Helm itself is built on: Go's text/template with the sprig function library
// (Debian's golang-github-masterminds-sprig-dev) and YAML through gopkg.in/yaml.v3. No
// helm binary is packaged for Debian or PyPI, so the chart tests
// (crates/device-plugin/tests/plugin/helm/) render with this.
//
// What it provides, as Helm does: .Values (the chart's values.yaml, then each -values
// file coalesced over it: maps merge key by key, a null removes the key), .Release (Name,
// Namespace, Service, Revision, IsInstall, IsUpgrade), .Chart (Chart.yaml's keys,
// capitalised as Helm exposes them), .Capabilities (KubeVersion 1.29, APIVersions.Has),
// .Template (Name, BasePath), Chart.yaml's kubeVersion checked against 1.29, and Helm's
// functions besides sprig's: include, tpl, toYaml, fromYaml, toJson, required, fail,
// lookup (always empty, as under `helm template`). sprig's env and expandenv are
// removed, as Helm removes them. A nil value prints as nothing, as in Helm.
//
// Stricter than Helm: a missing map key is an error (Helm prints nothing), so a
// template that names a value the chart does not define fails to render.
// Not provided: subcharts (dependencies), .Files, library charts, post-renderers.
//
// usage: helm_render [-release NAME] [-namespace NS] [-values FILE]... [-dump-values] [-notes] CHART_DIR
//
// It prints each rendered template as `---\n# Source: CHART/templates/FILE\n...` (empty
// ones left out), then NOTES.txt under `# Notes:` with -notes; with -dump-values, the
// coalesced values as JSON instead. A render error goes to stderr, exit status 1.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/template"

	"github.com/Masterminds/semver"
	"github.com/Masterminds/sprig"
	"gopkg.in/yaml.v3"
)

// kubeVersion is the cluster version .Capabilities reports (`helm template`'s default
// is its client's Kubernetes version).
const kubeVersion = "v1.29.0"

type valueFiles []string

func (v *valueFiles) String() string     { return strings.Join(*v, ",") }
func (v *valueFiles) Set(s string) error { *v = append(*v, s); return nil }

// apiVersions answers .Capabilities.APIVersions.Has for the groups a 1.29 cluster serves.
type apiVersions []string

func (a apiVersions) Has(version string) bool {
	for _, v := range a {
		if v == version || strings.HasPrefix(version, v+"/") {
			return true
		}
	}
	return false
}

func main() {
	release := flag.String("release", "nvshim", "release name")
	namespace := flag.String("namespace", "nvshim", "release namespace")
	dump := flag.Bool("dump-values", false, "print the coalesced values as JSON, render nothing")
	notes := flag.Bool("notes", false, "also render templates/NOTES.txt")
	var files valueFiles
	flag.Var(&files, "values", "a values file coalesced over the chart's (repeatable)")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: helm_render [-release NAME] [-namespace NS] [-values FILE]... [-dump-values] [-notes] CHART_DIR")
		os.Exit(2)
	}
	if err := run(flag.Arg(0), *release, *namespace, files, *dump, *notes); err != nil {
		fmt.Fprintln(os.Stderr, "helm_render:", err)
		os.Exit(1)
	}
}

func readYAML(path string) (map[string]interface{}, error) {
	text, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := map[string]interface{}{}
	if err := yaml.Unmarshal(text, &out); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if out == nil {
		out = map[string]interface{}{}
	}
	return out, nil
}

// coalesce puts over on top of base as Helm does for user values: nested maps merge,
// anything else replaces, and a null removes the key. With keepNull the key stays with a
// nil value instead, which templates see as Helm's missing key (empty, false) while the
// strict missing-key check still knows the name.
func coalesce(base, over map[string]interface{}, keepNull bool) map[string]interface{} {
	out := map[string]interface{}{}
	for k, v := range base {
		out[k] = v
	}
	for k, v := range over {
		if v == nil {
			if keepNull {
				out[k] = nil
			} else {
				delete(out, k)
			}
			continue
		}
		bm, baseIsMap := out[k].(map[string]interface{})
		om, overIsMap := v.(map[string]interface{})
		if baseIsMap && overIsMap {
			out[k] = coalesce(bm, om, keepNull)
		} else {
			out[k] = v
		}
	}
	return out
}

func toYAML(v interface{}) (string, error) {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(v); err != nil {
		return "", err
	}
	if err := enc.Close(); err != nil {
		return "", err
	}
	return strings.TrimSuffix(buf.String(), "\n"), nil
}

func run(chartDir, release, namespace string, files []string, dump, notes bool) error {
	chartMeta, err := readYAML(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		return err
	}
	chartName, _ := chartMeta["name"].(string)
	if chartName == "" {
		return errors.New("Chart.yaml has no name")
	}
	// Helm refuses a chart whose kubeVersion the cluster does not satisfy.
	if constraint, ok := chartMeta["kubeVersion"].(string); ok {
		c, err := semver.NewConstraint(constraint)
		if err != nil {
			return fmt.Errorf("Chart.yaml kubeVersion %q: %w", constraint, err)
		}
		if !c.Check(semver.MustParse(kubeVersion)) {
			return fmt.Errorf("chart requires kubeVersion %s, which %s does not satisfy", constraint, kubeVersion)
		}
	}
	values, err := readYAML(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		return err
	}
	// Helm's values (what its schema check sees) and the ones templates get.
	helmValues := values
	for _, file := range files {
		over, err := readYAML(file)
		if err != nil {
			return err
		}
		helmValues = coalesce(helmValues, over, false)
		values = coalesce(values, over, true)
	}
	if dump {
		out, err := json.Marshal(helmValues)
		if err != nil {
			return err
		}
		fmt.Println(string(out))
		return nil
	}
	chart := map[string]interface{}{}
	for k, v := range chartMeta {
		chart[strings.ToUpper(k[:1])+k[1:]] = v
	}
	top := map[string]interface{}{
		"Values": values,
		"Chart":  chart,
		"Release": map[string]interface{}{
			"Name": release, "Namespace": namespace, "Service": "Helm",
			"Revision": 1, "IsInstall": true, "IsUpgrade": false,
		},
		"Capabilities": map[string]interface{}{
			"KubeVersion": map[string]interface{}{
				"Version": kubeVersion, "GitVersion": kubeVersion, "Major": "1", "Minor": "29",
			},
			"APIVersions": apiVersions{"v1", "apps/v1", "batch/v1", "node.k8s.io/v1", "rbac.authorization.k8s.io/v1"},
		},
	}

	root := template.New(chartName).Option("missingkey=error")
	funcs := sprig.TxtFuncMap()
	delete(funcs, "env")
	delete(funcs, "expandenv")
	funcs["include"] = func(name string, data interface{}) (string, error) {
		var buf bytes.Buffer
		err := root.ExecuteTemplate(&buf, name, data)
		return buf.String(), err
	}
	funcs["tpl"] = func(text string, data interface{}) (string, error) {
		t, err := root.Clone()
		if err != nil {
			return "", err
		}
		t, err = t.New("tpl").Parse(text)
		if err != nil {
			return "", err
		}
		var buf bytes.Buffer
		err = t.Execute(&buf, data)
		return buf.String(), err
	}
	funcs["toYaml"] = func(v interface{}) string {
		out, err := toYAML(v)
		if err != nil {
			return ""
		}
		return out
	}
	funcs["fromYaml"] = func(text string) map[string]interface{} {
		out := map[string]interface{}{}
		if err := yaml.Unmarshal([]byte(text), &out); err != nil {
			out["Error"] = err.Error()
		}
		return out
	}
	funcs["toJson"] = func(v interface{}) string {
		out, err := json.Marshal(v)
		if err != nil {
			return ""
		}
		return string(out)
	}
	funcs["required"] = func(message string, v interface{}) (interface{}, error) {
		if v == nil {
			return nil, errors.New(message)
		}
		if s, ok := v.(string); ok && s == "" {
			return nil, errors.New(message)
		}
		return v, nil
	}
	funcs["fail"] = func(message string) (string, error) { return "", errors.New(message) }
	funcs["lookup"] = func(apiVersion, kind, namespace, name string) (map[string]interface{}, error) {
		return map[string]interface{}{}, nil
	}
	root.Funcs(funcs)

	templatesDir := filepath.Join(chartDir, "templates")
	entries, err := os.ReadDir(templatesDir)
	if err != nil {
		return err
	}
	var names []string
	for _, entry := range entries {
		if entry.IsDir() {
			return fmt.Errorf("%s: subdirectories of templates/ are not supported", entry.Name())
		}
		text, err := os.ReadFile(filepath.Join(templatesDir, entry.Name()))
		if err != nil {
			return err
		}
		name := chartName + "/templates/" + entry.Name()
		if _, err := root.New(name).Parse(string(text)); err != nil {
			return err
		}
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		base := filepath.Base(name)
		if strings.HasPrefix(base, "_") || base == "NOTES.txt" {
			continue
		}
		data := map[string]interface{}{}
		for k, v := range top {
			data[k] = v
		}
		data["Template"] = map[string]interface{}{"Name": name, "BasePath": chartName + "/templates"}
		var buf bytes.Buffer
		if err := root.ExecuteTemplate(&buf, name, data); err != nil {
			return err
		}
		// Helm prints a nil value as nothing, not text/template's "<no value>".
		text := strings.TrimSpace(strings.ReplaceAll(buf.String(), "<no value>", ""))
		if text == "" {
			continue
		}
		fmt.Printf("---\n# Source: %s\n%s\n", name, strings.TrimPrefix(text, "---\n"))
	}
	notesName := chartName + "/templates/NOTES.txt"
	if notes && root.Lookup(notesName) != nil {
		var buf bytes.Buffer
		if err := root.ExecuteTemplate(&buf, notesName, top); err != nil {
			return err
		}
		fmt.Printf("# Notes:\n%s\n", strings.TrimSpace(strings.ReplaceAll(buf.String(), "<no value>", "")))
	}
	return nil
}
