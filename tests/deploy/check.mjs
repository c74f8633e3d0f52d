// Offline checks of deploy/ (issue 8): every overlay renders (this folder's renderer, and the
// same objects as `kubectl kustomize` where kubectl exists); every object validates against
// the Kubernetes / Prometheus Operator schemas; the containers' flags are accepted by the real
// binaries; ports, probes, sockets, volumes, drain timing and sizes agree; alerts and the
// dashboard name only metrics the services export; the Dockerfile builds what the pods run.
// Prints "N passed, M failed" and exits non-zero on any failure.
import { execFileSync, spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { isDeepStrictEqual } from "node:util";
import YAML from "yaml";
import { build, parseDocs } from "./kustomize.mjs";

const root = process.env.DSF_SOURCE_DIR ?? path.resolve(path.dirname(new URL(import.meta.url).pathname), "../..");
const deploy = path.join(root, "deploy");
const bins = {
  "dsflash-inference": process.env.DSF_INFERENCE_BIN,
  "dsflash-expertstore": process.env.DSF_EXPERTSTORE_BIN,
};
let passed = 0, failed = 0;
function check(name, fn) {
  try {
    fn();
    ++passed;
    console.log(`ok   ${name}`);
  } catch (e) {
    ++failed;
    console.log(`FAIL ${name}: ${e.message}`);
  }
}
function assert(cond, msg) {
  if (!cond) throw new Error(msg);
}

// ---- models for schema validation ----
const MODELS = {
  "v1/ServiceAccount": "kubernetes-models/v1/ServiceAccount",
  "v1/ConfigMap": "kubernetes-models/v1/ConfigMap",
  "v1/Service": "kubernetes-models/v1/Service",
  "apps/v1/Deployment": "kubernetes-models/apps/v1/Deployment",
  "policy/v1/PodDisruptionBudget": "kubernetes-models/policy/v1/PodDisruptionBudget",
  "networking.k8s.io/v1/NetworkPolicy": "kubernetes-models/networking.k8s.io/v1/NetworkPolicy",
  "monitoring.coreos.com/v1/ServiceMonitor": "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor",
  "monitoring.coreos.com/v1/PrometheusRule": "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PrometheusRule",
};
async function validate(obj) {
  const key = `${obj.apiVersion}/${obj.kind}`;
  assert(MODELS[key], `no schema for ${key}`);
  const mod = await import(MODELS[key]);
  new mod[obj.kind](obj).validate();
}

// ---- rendering ----
const overlays = { base: "k8s/base", monitoring: "k8s/monitoring", gb10: "k8s/overlays/gb10" };
const rendered = {};
for (const [name, dir] of Object.entries(overlays)) {
  check(`render ${dir}`, () => {
    rendered[name] = build(path.join(deploy, dir));
    assert(rendered[name].length > 0, "nothing rendered");
  });
}
const hasKubectl = spawnSync("kubectl", ["version", "--client"], { stdio: "ignore" }).status === 0;
for (const [name, dir] of Object.entries(overlays)) {
  if (!hasKubectl || !rendered[name]) continue;
  check(`${dir} renders the same objects as kubectl kustomize`, () => {
    const theirs = parseDocs(execFileSync("kubectl", ["kustomize", path.join(deploy, dir)]).toString(), dir);
    assert(theirs.length === rendered[name].length, `${theirs.length} objects vs ${rendered[name].length}`);
    for (const t of theirs) {
      const m = rendered[name].find((o) => o.kind === t.kind && o.metadata.name === t.metadata.name);
      assert(m && isDeepStrictEqual(m, t), `${t.kind}/${t.metadata.name} differs`);
    }
  });
}
if (!hasKubectl) console.log("note: kubectl not installed; the renderer is not cross-checked here");
for (const [name, objs] of Object.entries(rendered)) {
  for (const o of objs) {
    await (async () => {
      try {
        await validate(o);
        ++passed;
        console.log(`ok   ${name}: ${o.kind}/${o.metadata.name} validates`);
      } catch (e) {
        ++failed;
        console.log(`FAIL ${name}: ${o.kind}/${o.metadata.name}: ${e.message}`);
      }
    })();
  }
}
check("every YAML file under deploy/ parses (no duplicate keys)", () => {
  const walk = (d) => fs.readdirSync(d, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? walk(path.join(d, e.name)) : [path.join(d, e.name)]);
  for (const f of walk(deploy).filter((f) => /\.ya?ml$/.test(f))) parseDocs(fs.readFileSync(f, "utf8"), f);
  for (const f of walk(deploy).filter((f) => f.endsWith(".json"))) JSON.parse(fs.readFileSync(f, "utf8"));
});

// ---- the pod ----
const objs = rendered.gb10 ?? [];
const get = (kind, name) => objs.find((o) => o.kind === kind && o.metadata.name === name);
const dep = get("Deployment", "dsflash");
const cfg = get("ConfigMap", "dsflash-config")?.data ?? {};
const pod = dep?.spec.template.spec;
const containers = Object.fromEntries((pod?.containers ?? []).map((c) => [c.name, c]));
const expand = (s) => s.replace(/\$\((\w+)\)/g, (_, v) => {
  assert(v in cfg, `$(${v}) is not in dsflash-config`);
  return cfg[v];
});
const args = (c) => c.args.map(expand);
const flag = (c, f) => {
  const a = args(c);
  const i = a.indexOf(f);
  return i >= 0 ? a[i + 1] : undefined;
};
const portOf = (addr) => Number(addr.slice(addr.lastIndexOf(":") + 1));

check("both containers exist and run the image's binaries", () => {
  for (const [n, b] of [["inference", "dsflash-inference"], ["expertstore", "dsflash-expertstore"]]) {
    assert(containers[n], `no container ${n}`);
    assert(containers[n].command[0] === `/usr/local/bin/${b}`, `${n} runs ${containers[n].command[0]}`);
  }
});

for (const c of Object.values(containers)) {
  const bin = bins[path.basename(c.command[0])];
  check(`${c.name}: every flag appears in '${path.basename(c.command[0])} --help'`, () => {
    assert(bin, `no local binary for ${c.command[0]} (DSF_*_BIN)`);
    const help = execFileSync(bin, ["--help"]).toString();
    for (const a of c.args.filter((x) => x.startsWith("--"))) assert(help.includes(a), `${a} is not a flag of ${bin}`);
  });
  check(`${c.name}: the binary accepts the rendered arguments (fails only on the absent model)`, () => {
    const a = args(c).map((x) => (x === cfg.MODEL_PATH ? path.join(os.tmpdir(), "dsflash-no-such-model.gguf") : x));
    const r = spawnSync(bin, a, { encoding: "utf8", timeout: 20000 });
    assert(r.status === 1, `exit ${r.status}: ${r.stderr.slice(0, 300)}`);
    assert(/dsflash-no-such-model\.gguf/.test(r.stderr), `unexpected error: ${r.stderr.slice(0, 300)}`);
  });
}

check("ports: --listen/--metrics, probes and Service targets agree", () => {
  const ports = (c) => Object.fromEntries(c.ports.map((p) => [p.name, p.containerPort]));
  const inf = containers.inference, st = containers.expertstore;
  assert(Object.values(ports(inf)).includes(portOf(flag(inf, "--listen"))), "inference --listen port not exposed");
  assert(ports(inf).metrics === portOf(flag(inf, "--metrics")), "inference metrics port");
  const tcp = flag(st, "--listen").split(",").find((a) => !a.startsWith("unix:"));
  assert(tcp && ports(st)["store-grpc"] === portOf(tcp), "store TCP listen port");
  assert(ports(st)["store-metrics"] === portOf(flag(st, "--metrics")), "store metrics port");
  for (const c of [inf, st]) {
    for (const p of ["startupProbe", "readinessProbe", "livenessProbe"]) {
      assert(c[p]?.grpc, `${c.name} ${p} is not a gRPC probe`);
      assert(Object.values(ports(c)).includes(c[p].grpc.port), `${c.name} ${p} port ${c[p].grpc.port}`);
    }
    assert(!c.livenessProbe.grpc.service, `${c.name} liveness must probe "" only`);
  }
  assert(inf.readinessProbe.grpc.service === "dsflash.v1.Inference", "inference readiness service");
  assert(st.readinessProbe.grpc.service === "dsflash.v1.ExpertStore", "store readiness service");
  const svc = get("Service", "dsflash");
  const named = new Set(Object.values(containers).flatMap((c) => c.ports.map((p) => p.name)));
  for (const p of svc.spec.ports) assert(named.has(p.targetPort), `Service targetPort ${p.targetPort}`);
  const sm = get("ServiceMonitor", "dsflash");
  const svcPorts = new Set(svc.spec.ports.map((p) => p.name));
  for (const e of sm.spec.endpoints) assert(svcPorts.has(e.port), `ServiceMonitor port ${e.port}`);
  const np = get("NetworkPolicy", "dsflash");
  const allowed = new Set(np.spec.ingress.flatMap((r) => r.ports.map((p) => p.port)));
  for (const p of svc.spec.ports) assert(allowed.has(p.port), `NetworkPolicy does not admit ${p.port}`);
});

check("the health service names exist in the protos", () => {
  const protos = ["inference", "expertstore"].map((p) =>
    fs.readFileSync(path.join(root, `proto/dsflash/v1/${p}.proto`), "utf8")).join("\n");
  assert(/package dsflash\.v1;/.test(protos) && /service Inference\b/.test(protos) && /service ExpertStore\b/.test(protos),
         "dsflash.v1.Inference / dsflash.v1.ExpertStore not found");
});

check("sockets: the store's unix address and fd socket are on a shared emptyDir", () => {
  const inf = containers.inference, st = containers.expertstore;
  const sock = flag(inf, "--expert-store");
  assert(sock?.startsWith("unix:"), "--expert-store is not a unix: address");
  assert(flag(st, "--listen").split(",").includes(sock), `store does not listen on ${sock}`);
  const dirs = [path.dirname(sock.slice(5)), path.dirname(flag(st, "--fd-socket"))];
  for (const d of dirs) {
    const vols = [inf, st].map((c) => c.volumeMounts.find((m) => m.mountPath === d)?.name);
    assert(vols[0] && vols[0] === vols[1], `${d} is not one volume in both containers`);
    assert(pod.volumes.find((v) => v.name === vols[0]).emptyDir, `${vols[0]} is not an emptyDir`);
  }
});

check("the model is mounted read-only in both containers", () => {
  for (const c of Object.values(containers)) {
    const m = c.volumeMounts.find((v) => flag(c, "--model").startsWith(v.mountPath + "/"));
    assert(m && m.readOnly, `${c.name}: --model ${flag(c, "--model")} not under a read-only mount`);
  }
});

check("drain: grace period covers preStop + drain; the store outlives the inference drain", () => {
  const sleep = (c) => Number(c.lifecycle.preStop.exec.command.at(-1));
  const drain = Number(flag(containers.inference, "--grace-seconds"));
  assert(pod.terminationGracePeriodSeconds >= sleep(containers.inference) + drain,
         `grace ${pod.terminationGracePeriodSeconds} < ${sleep(containers.inference)} + ${drain}`);
  assert(sleep(containers.expertstore) >= sleep(containers.inference) + drain, "the store stops before the drain ends");
  assert(pod.terminationGracePeriodSeconds >= sleep(containers.expertstore), "store preStop exceeds the grace period");
});

const bytes = (q) => {
  const m = /^(\d+(?:\.\d+)?)([KMGT]i?)?$/.exec(q);
  assert(m, `not a size: ${q}`);
  const unit = { K: 1e3, M: 1e6, G: 1e9, T: 1e12, Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40 }[m[2] ?? ""] ?? 1;
  return Number(m[1]) * unit;
};
check("sizes come from config.env: limits, socket volume and arena budget agree", () => {
  const st = containers.expertstore, inf = containers.inference;
  for (const [c, key] of [[st, "STORE_MEMORY"], [inf, "INFERENCE_MEMORY"]]) {
    assert(c.resources.limits.memory === cfg[key] && c.resources.requests.memory === cfg[key], `${c.name} memory != ${key}`);
  }
  assert(pod.volumes.find((v) => v.name === "sockets").emptyDir.sizeLimit === cfg.SOCKETS_SIZE, "sockets size");
  // --budget takes K/M/G/T as binary units.
  const budget = bytes(flag(st, "--budget").replace(/([KMGT])$/, "$1i"));
  if (flag(st, "--arena") === "host") {
    assert(bytes(cfg.STORE_MEMORY) >= budget + 2 ** 30, `STORE_MEMORY ${cfg.STORE_MEMORY} leaves < 1 GiB over the arena`);
  }
});

check("backend and arena agree: the CPU backend reads a host arena, the CUDA backend a device arena", () => {
  const arena = flag(containers.expertstore, "--arena"), backend = flag(containers.inference, "--backend");
  assert(["cpu", "cuda"].includes(backend), `--backend ${backend}`);
  assert(arena === (backend === "cuda" ? "device" : "host"), `--backend ${backend} with --arena ${arena}`);
});

check("security context: non-root, read-only root, no privilege escalation, no capabilities", () => {
  assert(pod.securityContext.runAsNonRoot === true && pod.securityContext.runAsUser > 0, "pod runs as root");
  assert(pod.automountServiceAccountToken === false, "service account token mounted");
  for (const c of Object.values(containers)) {
    const s = c.securityContext;
    assert(s.readOnlyRootFilesystem && s.allowPrivilegeEscalation === false && s.capabilities.drop.includes("ALL"),
           `${c.name} security context`);
  }
});

check("gb10: scheduled on arm64 GB10 nodes, the GPU shared by both containers, PDB allows drains", () => {
  assert(pod.nodeSelector["nvidia.com/gpu.product"] === "NVIDIA-GB10", "GPU product selector");
  assert(pod.nodeSelector["kubernetes.io/arch"] === "arm64", "arch selector");
  for (const c of Object.values(containers)) assert(c.resources.limits["nvidia.com/gpu"] === "1", `${c.name} GPU`);
  const pdb = get("PodDisruptionBudget", "dsflash");
  assert(pdb.spec.maxUnavailable === 1, "PDB maxUnavailable");
  assert(dep.spec.template.spec.affinity.podAntiAffinity, "no anti-affinity: two pods could share a node");
});

// ---- metrics named by alerts and dashboards ----
const exported = new Set();
for (const f of (process.env.DSF_METRICS_FILES ?? "").split(",").filter(Boolean)) {
  for (const line of fs.readFileSync(f, "utf8").split("\n")) {
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)/.exec(line);
    if (m && !line.startsWith("#")) exported.add(m[1]);
  }
}
const EXTERNAL = new Set(["up"]);  // Prometheus's own scrape series
const PROMQL = new Set(["sum", "max", "min", "avg", "count", "rate", "increase", "irate", "histogram_quantile", "by",
  "without", "and", "or", "unless", "on", "ignoring", "group_left", "group_right", "bool", "offset", "le", "abs",
  "clamp_min", "clamp_max", "topk", "bottomk", "stddev", "delta", "deriv", "vector", "scalar", "time"]);
function metricNames(expr) {
  const noStrings = expr.replace(/"[^"]*"/g, '""').replace(/\{[^}]*\}/g, "{}").replace(/\[[^\]]*\]/g, "[]")
    .replace(/\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)/g, " ");
  const names = new Set();
  for (const m of noStrings.matchAll(/[a-zA-Z_:][a-zA-Z0-9_:]*/g)) {
    const after = noStrings.slice(m.index + m[0].length).trimStart();
    if (PROMQL.has(m[0]) || after.startsWith("(")) continue;
    names.add(m[0]);
  }
  return names;
}
check("alerts and dashboard panels name only exported metrics", () => {
  assert(exported.size > 20, `only ${exported.size} exported metric names read (DSF_METRICS_FILES)`);
  const exprs = [];
  const rule = get("PrometheusRule", "dsflash");
  for (const g of rule.spec.groups) for (const r of g.rules) exprs.push([`alert ${r.alert}`, r.expr]);
  const dash = JSON.parse(get("ConfigMap", "dsflash-dashboard").data["dsflash.json"]);
  for (const p of dash.panels) for (const t of p.targets) exprs.push([`panel '${p.title}'`, t.expr]);
  for (const [where, e] of exprs) {
    for (const n of metricNames(e)) assert(exported.has(n) || EXTERNAL.has(n), `${where}: ${n} is not exported`);
  }
  const alerts = new Set(rule.spec.groups.flatMap((g) => g.rules.map((r) => r.alert)));
  for (const a of ["DsflashExpertStoreDown", "DsflashNotReady", "DsflashTimeToFirstTokenBudgetBurn",
                   "DsflashInterTokenLatencyBudgetBurn", "DsflashAdmissionRejections", "DsflashExpertMissRateHigh"]) {
    assert(alerts.has(a), `missing alert ${a}`);
  }
});
const hasPromtool = spawnSync("promtool", ["--version"], { stdio: "ignore" }).status === 0;
if (hasPromtool) {
  check("promtool check rules accepts the PrometheusRule", () => {
    const f = path.join(fs.mkdtempSync(path.join(os.tmpdir(), "dsf-rules-")), "rules.yaml");
    fs.writeFileSync(f, YAML.stringify({ groups: get("PrometheusRule", "dsflash").spec.groups }));
    const r = spawnSync("promtool", ["check", "rules", f], { encoding: "utf8" });
    assert(r.status === 0, r.stdout + r.stderr);
  });
}

// ---- the image ----
check("Dockerfile: multi-stage, both GPU targets, non-root runtime without build tools", () => {
  const df = fs.readFileSync(path.join(deploy, "docker/Dockerfile"), "utf8");
  const stages = df.split(/^FROM /m).slice(1);
  assert(stages.length >= 2, "not multi-stage");
  const runtime = stages.at(-1);
  assert(!/apt-get install[^\n]*(build-essential|cmake|g\+\+|gcc|ninja)/.test(runtime), "build tools in the runtime stage");
  const user = /^USER\s+(\S+)/m.exec(runtime);
  assert(user && !/^(0|root)(:|$)/.test(user[1]), "runtime stage does not switch to a non-root user");
  assert(/CUDA_ARCHS="90;121"/.test(df), "CUDA architectures are not 90;121");
  const cmake = ["inference_svc", "expertstore_svc", "tools"].map((d) =>
    fs.readFileSync(path.join(root, d, "CMakeLists.txt"), "utf8")).join("\n");
  for (const t of ["dsflash-inference", "dsflash-expertstore", "dsflash"]) {
    assert(new RegExp(`add_executable\\(${t}\\s`).test(cmake), `no CMake target ${t}`);
    assert(df.includes(t), `the image does not build ${t}`);
  }
  for (const c of Object.values(containers)) assert(df.includes(path.basename(c.command[0])), `${c.command[0]} not in image`);
});

console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
