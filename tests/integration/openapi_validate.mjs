// Validates an OpenAPI document with @seriousme/openapi-schema-validator (tests/js). Usage:
//   node openapi_validate.mjs FILE   -> JSON {valid, version, errors}
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const entry = path.join(here, '..', 'js', 'node_modules', '@seriousme', 'openapi-schema-validator',
  'index.js');
const { Validator } = await import(pathToFileURL(entry).href);
const validator = new Validator();
const res = await validator.validate(process.argv[2]);
process.stdout.write(JSON.stringify({ valid: res.valid, version: validator.version ?? null,
  errors: res.errors ?? null }) + '\n');
