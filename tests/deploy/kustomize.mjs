// A small kustomize renderer for the subset deploy/ uses (resources, configMapGenerator with
// envs/files/literals and create/merge behaviour, strategic-merge patches, namespace, labels,
// images, replacements), so that CI can render the overlays without kubectl. Anything
// outside the subset is an error, never silently ignored. When kubectl is present,
// check.mjs also compares this output with `kubectl kustomize`.
import fs from "node:fs";
import path from "node:path";
import YAML from "yaml";

const KNOWN = new Set([
  "apiVersion", "kind", "resources", "configMapGenerator", "generatorOptions", "patches", "namespace",
  "labels", "images", "replacements",
]);

export function parseDocs(text, where) {
  return YAML.parseAllDocuments(text).map((d) => {
    if (d.errors.length) throw new Error(`${where}: ${d.errors[0].message}`);
    return d.toJS();
  }).filter((o) => o !== null && o !== undefined);
}

function readEnvFile(file) {
  const data = {};
  for (const raw of fs.readFileSync(file, "utf8").split("\n")) {
    const line = raw.trim();
    if (!line || line.startsWith("#")) continue;
    const eq = line.indexOf("=");
    if (eq < 0) throw new Error(`${file}: not KEY=VALUE: ${line}`);
    data[line.slice(0, eq)] = line.slice(eq + 1);
  }
  return data;
}

const isMap = (v) => v !== null && typeof v === "object" && !Array.isArray(v);

// Strategic merge: maps merge recursively; lists of maps with a "name" merge by name
// (containers, volumes, ports, env...); other lists are replaced.
export function strategicMerge(base, patch) {
  if (isMap(base) && isMap(patch)) {
    const out = { ...base };
    for (const [k, v] of Object.entries(patch)) {
      if (v === null) delete out[k];
      else out[k] = k in base ? strategicMerge(base[k], v) : v;
    }
    return out;
  }
  if (Array.isArray(base) && Array.isArray(patch) && patch.every((x) => isMap(x) && "name" in x) &&
      base.every((x) => isMap(x) && "name" in x)) {
    const out = base.map((x) => ({ ...x }));
    for (const p of patch) {
      const i = out.findIndex((x) => x.name === p.name);
      if (i >= 0) out[i] = strategicMerge(out[i], p);
      else out.push(p);
    }
    return out;
  }
  return patch;
}

const same = (a, b) => a.kind === b.kind && a.metadata?.name === b.metadata?.name;

// "a.b.[name=x].c" -> [["a"], ["b"], ["sel", "name", "x"], ["c"]]
function parsePath(fieldPath) {
  return fieldPath.split(".").map((p) => {
    const m = /^\[(\w+)=(.*)\]$/.exec(p);
    return m ? ["sel", m[1], m[2]] : ["key", p];
  });
}

function getPath(obj, fieldPath) {
  let cur = obj;
  for (const [t, a, b] of parsePath(fieldPath)) {
    if (cur === undefined) return undefined;
    cur = t === "sel" ? cur.find((x) => String(x[a]) === b) : cur[a];
  }
  return cur;
}

function setPath(obj, fieldPath, value) {
  const parts = parsePath(fieldPath);
  let cur = obj;
  for (let i = 0; i < parts.length - 1; ++i) {
    const [t, a, b] = parts[i];
    const next = t === "sel" ? cur.find((x) => String(x[a]) === b) : cur[a];
    if (next === undefined) throw new Error(`replacement target ${fieldPath}: ${a} not found`);
    cur = next;
  }
  cur[parts[parts.length - 1][1]] = value;
}

export function build(dir) {
  const kfile = path.join(dir, "kustomization.yaml");
  const k = parseDocs(fs.readFileSync(kfile, "utf8"), kfile)[0];
  for (const key of Object.keys(k)) {
    if (!KNOWN.has(key)) throw new Error(`${kfile}: '${key}' is outside this renderer's subset`);
  }
  let objs = [];
  for (const r of k.resources ?? []) {
    const p = path.join(dir, r);
    objs = objs.concat(fs.statSync(p).isDirectory() ? build(p) : parseDocs(fs.readFileSync(p, "utf8"), p));
  }
  for (const g of k.configMapGenerator ?? []) {
    const noHash = g.options?.disableNameSuffixHash ?? k.generatorOptions?.disableNameSuffixHash;
    if (!noHash) throw new Error(`${kfile}: ${g.name}: name-suffix hashes are outside this renderer's subset`);
    const data = {};
    for (const e of g.envs ?? []) Object.assign(data, readEnvFile(path.join(dir, e)));
    for (const f of g.files ?? []) data[path.basename(f)] = fs.readFileSync(path.join(dir, f), "utf8");
    for (const l of g.literals ?? []) data[l.slice(0, l.indexOf("="))] = l.slice(l.indexOf("=") + 1);
    const cm = { apiVersion: "v1", kind: "ConfigMap", metadata: { name: g.name }, data };
    if (g.options?.labels) cm.metadata.labels = { ...g.options.labels };
    const i = objs.findIndex((o) => same(o, cm));
    if ((g.behavior ?? "create") === "create") {
      if (i >= 0) throw new Error(`${kfile}: ConfigMap ${g.name} already exists`);
      objs.push(cm);
    } else if (g.behavior === "merge") {
      if (i < 0) throw new Error(`${kfile}: no ConfigMap ${g.name} to merge into`);
      objs[i] = { ...objs[i], data: { ...objs[i].data, ...data } };
    } else {
      throw new Error(`${kfile}: behavior ${g.behavior} is outside this renderer's subset`);
    }
  }
  for (const p of k.patches ?? []) {
    if (!p.path || p.target) throw new Error(`${kfile}: only patches with a path (strategic merge) are supported`);
    for (const patch of parseDocs(fs.readFileSync(path.join(dir, p.path), "utf8"), p.path)) {
      const i = objs.findIndex((o) => same(o, patch));
      if (i < 0) throw new Error(`${kfile}: patch ${p.path} matches no ${patch.kind}/${patch.metadata?.name}`);
      objs[i] = strategicMerge(objs[i], patch);
    }
  }
  if (k.namespace) for (const o of objs) o.metadata = { ...o.metadata, namespace: k.namespace };
  for (const l of k.labels ?? []) {
    if (l.includeSelectors || l.includeTemplates) throw new Error(`${kfile}: label selectors/templates unsupported`);
    for (const o of objs) o.metadata = { ...o.metadata, labels: { ...o.metadata.labels, ...l.pairs } };
  }
  for (const img of k.images ?? []) {
    for (const o of objs) {
      for (const c of o.spec?.template?.spec?.containers ?? []) {
        const [name] = c.image.split(":");
        if (name === img.name) c.image = `${img.newName ?? name}:${img.newTag ?? "latest"}`;
      }
    }
  }
  for (const r of k.replacements ?? []) {
    const src = objs.find((o) => o.kind === r.source.kind && o.metadata.name === r.source.name);
    if (!src) throw new Error(`${kfile}: replacement source ${r.source.kind}/${r.source.name} not found`);
    const value = getPath(src, r.source.fieldPath);
    if (value === undefined) throw new Error(`${kfile}: replacement source field ${r.source.fieldPath} not found`);
    for (const t of r.targets) {
      for (const o of objs.filter((x) => x.kind === t.select.kind && x.metadata.name === t.select.name)) {
        for (const fp of t.fieldPaths) setPath(o, fp, value);
      }
    }
  }
  return objs;
}
