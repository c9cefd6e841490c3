// The SDK's main flow against a live Kiln: upload, wait for the variants, predict, list, delete.
//   KILN_URL=http://127.0.0.1:8000 KILN_MODEL_PATH=mlp.pt npm test
// KILN_MODEL_PATH is a TorchScript file taking x: float32[-1, 64], like tests/models.py's `mlp`.
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { test } from 'node:test';

import {
  client,
  deleteModel,
  getModel,
  getModelVersion,
  listModels,
  predict,
  uploadModel,
  v2Infer,
  v2Live,
} from '../dist/index.js';

const { KILN_URL, KILN_MODEL_PATH } = process.env;
const SETTLED = new Set(['ready', 'failed', 'rejected']);

async function waitSettled(name, version, timeoutMs = 120_000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const { data } = await getModelVersion({ path: { name, version }, throwOnError: true });
    if (data.variants.every((v) => SETTLED.has(v.status))) return data.variants;
    assert.ok(Date.now() < deadline, `${name} v${version} did not settle: ${JSON.stringify(data.variants)}`);
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
}

test(
  'upload, settle, predict, list, delete',
  { skip: KILN_URL && KILN_MODEL_PATH ? false : 'needs KILN_URL and KILN_MODEL_PATH' },
  async () => {
    client.setConfig({ baseUrl: KILN_URL });
    // A fresh name per run: an upload of known bytes under a known name is deduplicated (200).
    const name = `ts-sdk-${process.pid}-${Date.now()}`;
    const config = { name, inputs: [{ name: 'x', dtype: 'float32', shape: [-1, 64] }], backends: [] };

    const upload = await uploadModel({
      body: { file: new Blob([await readFile(KILN_MODEL_PATH)]), config: JSON.stringify(config) },
      throwOnError: true,
    });
    assert.equal(upload.response.status, 202);
    assert.equal(upload.data.name, name);

    const variants = await waitSettled(name, upload.data.version);
    assert.ok(variants.some((v) => v.backend === 'torchscript' && v.status === 'ready'));

    const { data: result } = await predict({
      path: { name },
      body: { inputs: { x: [Array(64).fill(0.5), Array(64).fill(-0.5)] } },
      throwOnError: true,
    });
    assert.equal(result.model_version, upload.data.version);
    assert.equal(result.outputs.output0.length, 2);
    assert.equal(result.outputs.output0[0].length, 10);

    // The Open Inference Protocol's JSON, typed by the spec.
    const { data: inferred } = await v2Infer({
      path: { name },
      body: { id: 'ts', inputs: [{ name: 'x', shape: [1, 64], datatype: 'FP32', data: Array(64).fill(0.5) }] },
      throwOnError: true,
    });
    assert.deepEqual([inferred.id, inferred.model_version], ['ts', String(upload.data.version)]);
    assert.deepEqual([inferred.outputs[0].name, inferred.outputs[0].shape], ['output0', [1, 10]]);
    assert.deepEqual((await v2Live({ throwOnError: true })).data, { live: true });

    const { data: listed } = await listModels({ throwOnError: true });
    assert.ok(listed.models.some((m) => m.name === name));

    await deleteModel({ path: { name }, throwOnError: true });
    const gone = await getModel({ path: { name } });
    assert.equal(gone.response.status, 404);
    // A problem+json body, parsed: the spec lists it.
    assert.equal(gone.error.status, 404);
    assert.ok(gone.error.detail.includes(name));
  },
);
