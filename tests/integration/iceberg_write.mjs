// Test helper: writes the pieces of an Iceberg table from a JSON job file (argv[2]):
//   {"parquet": [{path, column, form: "hex"|"binary"|"url", values: [string|null], codec,
//                 payload_bytes (optional: a VARCHAR column `payload` of about that many bytes
//                 per row),
//                 page_version: 1|2, extra_columns: [{column, form, values}]}],
//    "avro": [{path, kind: "list"|"manifest", version: 1|2, codec: "null"|"deflate",
//              meta: {key: string}, records: [...]}]}
// A list record may give manifest_length_of: the local path of a manifest written before it.
// Parquet through DuckDB, Avro through avsc with the Iceberg spec's schemas (field-ids included).
import { createWriteStream, readFileSync, statSync } from 'node:fs';
import { createRequire } from 'node:module';
const require = createRequire(import.meta.url);
const avro = require('avsc');

const job = JSON.parse(readFileSync(process.argv[2], 'utf8'));

const opt = (type, id) => ({ type: ['null', type], default: null, 'field-id': id });
const kvArray = (name, k, v, valueType) => ({
  type: 'array', logicalType: 'map',
  items: { type: 'record', name, fields: [
    { name: 'key', type: 'int', 'field-id': k }, { name: 'value', type: valueType, 'field-id': v }] },
});

function listSchema(version) {
  const fields = [
    { name: 'manifest_path', type: 'string', 'field-id': 500 },
    { name: 'manifest_length', type: 'long', 'field-id': 501 },
    { name: 'partition_spec_id', type: 'int', 'field-id': 502 },
  ];
  if (version >= 2) {
    fields.push({ name: 'content', type: 'int', 'field-id': 517 },
      { name: 'sequence_number', type: 'long', 'field-id': 515 },
      { name: 'min_sequence_number', type: 'long', 'field-id': 516 },
      { name: 'added_snapshot_id', type: 'long', 'field-id': 503 },
      { name: 'added_files_count', type: 'int', 'field-id': 504 },
      { name: 'existing_files_count', type: 'int', 'field-id': 505 },
      { name: 'deleted_files_count', type: 'int', 'field-id': 506 });
  } else {
    fields.push({ name: 'added_snapshot_id', type: 'long', 'field-id': 503 },
      { name: 'added_data_files_count', ...opt('int', 504) },
      { name: 'existing_data_files_count', ...opt('int', 505) },
      { name: 'deleted_data_files_count', ...opt('int', 506) });
  }
  fields.push({ name: 'partitions', default: null, 'field-id': 507, type: ['null', {
    type: 'array', 'element-id': 508, items: { type: 'record', name: 'r508', fields: [
      { name: 'contains_null', type: 'boolean', 'field-id': 509 },
      { name: 'contains_nan', ...opt('boolean', 518) }, { name: 'lower_bound', ...opt('bytes', 510) },
      { name: 'upper_bound', ...opt('bytes', 511) }] } }] });
  return { type: 'record', name: 'manifest_file', fields };
}

function manifestSchema(version) {
  const df = [];
  if (version >= 2) df.push({ name: 'content', type: 'int', 'field-id': 134 });
  df.push({ name: 'file_path', type: 'string', 'field-id': 100 },
    { name: 'file_format', type: 'string', 'field-id': 101 },
    { name: 'partition', 'field-id': 102, type: { type: 'record', name: 'r102', fields: [
      { name: 'x', ...opt('string', 1000) }] } },
    { name: 'record_count', type: 'long', 'field-id': 103 },
    { name: 'file_size_in_bytes', type: 'long', 'field-id': 104 });
  if (version === 1) df.push({ name: 'block_size_in_bytes', type: 'long', 'field-id': 105 });
  df.push({ name: 'column_sizes', default: null, 'field-id': 108,
      type: ['null', kvArray('k117_v118', 117, 118, 'long')] },
    { name: 'lower_bounds', default: null, 'field-id': 125,
      type: ['null', kvArray('k126_v127', 126, 127, 'bytes')] },
    { name: 'split_offsets', default: null, 'field-id': 132,
      type: ['null', { type: 'array', items: 'long', 'element-id': 133 }] });
  const fields = [{ name: 'status', type: 'int', 'field-id': 0 }];
  if (version >= 2) {
    fields.push({ name: 'snapshot_id', ...opt('long', 1) },
      { name: 'sequence_number', ...opt('long', 3) },
      { name: 'file_sequence_number', ...opt('long', 4) });
  } else {
    fields.push({ name: 'snapshot_id', type: 'long', 'field-id': 1 });
  }
  fields.push({ name: 'data_file', 'field-id': 2,
    type: { type: 'record', name: 'r2', fields: df } });
  return { type: 'record', name: 'manifest_entry', fields };
}

function writeAvro(a) {
  const schema = a.kind === 'list' ? listSchema(a.version) : manifestSchema(a.version);
  const type = avro.Type.forSchema(schema, { wrapUnions: false });
  const metadata = {};
  for (const [k, v] of Object.entries(a.meta || {})) metadata[k] = Buffer.from(v);
  if (!('schema' in metadata) && a.kind === 'manifest') metadata.schema = Buffer.from('{}');
  return new Promise((resolve, reject) => {
    // avro.createFileEncoder's 'finish' comes before the file is written: wait for the file
    const enc = new avro.streams.BlockEncoder(type, { codec: a.codec || 'null', metadata });
    const out = createWriteStream(a.path, { defaultEncoding: 'binary' });
    enc.pipe(out);
    enc.on('error', reject);
    out.on('error', reject);
    out.on('close', resolve);
    for (const r of a.records) {
      const rec = { ...r };
      if (a.kind === 'manifest') {
        const d = { column_sizes: null,
          lower_bounds: null, split_offsets: null, file_size_in_bytes: 100, record_count: 1,
          file_format: 'PARQUET', ...r.data_file };
        d.partition = { x: null };
        if (a.version === 1) d.block_size_in_bytes = 67108864;
        if (d.column_sizes) d.column_sizes = d.column_sizes.map(([key, value]) => ({ key, value }));
        if (d.lower_bounds) d.lower_bounds = d.lower_bounds.map(
          ([key, value]) => ({ key, value: Buffer.from(value) }));
        rec.data_file = d;
        if (a.version === 1 && rec.snapshot_id == null) rec.snapshot_id = 1;
      } else {
        rec.partitions = rec.partitions ?? null;
        // manifest_length_of: a local manifest written earlier in this job: its real length
        if (rec.manifest_length_of) rec.manifest_length = statSync(rec.manifest_length_of).size;
        delete rec.manifest_length_of;
        rec.manifest_length = rec.manifest_length ?? 1000;
        rec.partition_spec_id = rec.partition_spec_id ?? 0;
      }
      enc.write(rec);
    }
    enc.end();
  });
}

async function writeParquet(con, p) {
  // The hash column, plus optional more: extra_columns: [{column, form, values}] (rows beyond a
  // column's values are NULL).
  const cols = [{ column: p.column, form: p.form, values: p.values }, ...(p.extra_columns || [])];
  const lit = (c, v) => {
    if (v === null || v === undefined) return 'NULL';
    if (c.form === 'binary') return `unhex('${v}')::BLOB`;
    return `'${v.replace(/'/g, "''")}'`;
  };
  const defs = cols.map((c) => `${c.column} ${c.form === 'binary' ? 'BLOB' : 'VARCHAR'}`);
  await con.run(`CREATE OR REPLACE TABLE t (id INTEGER, ${defs.join(', ')})`);
  const rows = Math.max(...cols.map((c) => c.values.length));
  if (rows) {
    const tuples = [];
    for (let i = 0; i < rows; i++) tuples.push(`(${i}, ${cols.map((c) => lit(c, c.values[i])).join(', ')})`);
    await con.run(`INSERT INTO t VALUES ${tuples.join(', ')}`);
  }
  if (p.payload_bytes) { // a bulky second column (a reader of the hash column should skip it)
    await con.run('ALTER TABLE t ADD COLUMN payload VARCHAR');
    await con.run(`UPDATE t SET payload = repeat(md5(id::VARCHAR || random()::VARCHAR),
                   ${Math.ceil(p.payload_bytes / 32)})`);
  }
  const pv = p.page_version === 2 ? ", PARQUET_VERSION 'V2'" : '';
  await con.run(`COPY t TO '${p.path}' (FORMAT parquet, COMPRESSION '${p.codec || 'snappy'}'${pv},
                 ROW_GROUP_SIZE ${p.row_group_size || 122880})`);
}

if ((job.parquet || []).length) { // DuckDB only when there is Parquet to write (it loads slowly)
  const { DuckDBInstance } = require('@duckdb/node-api');
  const db = await DuckDBInstance.create(':memory:', {
    autoinstall_known_extensions: 'false', autoload_known_extensions: 'false' });
  const con = await db.connect();
  for (const p of job.parquet) await writeParquet(con, p);
}
for (const a of job.avro || []) await writeAvro(a);
