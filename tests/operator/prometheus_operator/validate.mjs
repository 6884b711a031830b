// Validates Prometheus Operator objects against the monitoring.coreos.com/v1 CRD schemas that
// @kubernetes-models/prometheus-operator compiles from the operator's published CRDs.
//   node validate.mjs MODELS_DIR < objects.json
// MODELS_DIR holds the node_modules that `make` installs from this folder's package-lock.json.
// stdin: a JSON array of objects; stdout: a JSON array, for each object its errors (empty when
// valid). An object of a kind with no schema here is an error, never a pass.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [modelsDir] = process.argv.slice(2);
const schemas = join(modelsDir, "node_modules", "@kubernetes-models", "prometheus-operator", "_schemas");
const KINDS = ["PodMonitor", "ServiceMonitor", "PrometheusRule"];
const validators = {};
for (const kind of KINDS) {
  const module = await import(pathToFileURL(join(schemas, `MonitoringCoreosComV1${kind}.js`)).href);
  validators[kind] = module.validate;
}

const objects = JSON.parse(readFileSync(0, "utf8"));
const results = objects.map((object) => {
  if (object.apiVersion !== "monitoring.coreos.com/v1" || !(object.kind in validators)) {
    return [`no monitoring.coreos.com/v1 schema for ${object.apiVersion} ${object.kind}`];
  }
  const validate = validators[object.kind];
  if (validate(object)) return [];
  return validate.errors.map(
    (e) => `${e.instancePath || "/"}: ${e.keyword} ${JSON.stringify(e.params)}`,
  );
});
process.stdout.write(JSON.stringify(results));
