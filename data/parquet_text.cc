// data/parquet_text.cc: see parquet_text.h. Apache Arrow's low-level parquet reader
// (parquet::ParquetFileReader and a ByteArray column reader): it decodes one page at a time, so a
// row group is never held whole. Built into build/libparquet_text.so only with the Makefile's
// PARQUET_BUILD; self-contained (it calls nothing of the engine's), as a library dlopen'd by ./train.
#include "data/parquet_text.h"

#include <parquet/api/reader.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace {
constexpr int64_t kRowsPerBatch = 256;    // rows decoded per ReadBatch call
constexpr int64_t kReadBuffer = 1 << 20;  // bytes the buffered stream reads at a time
}  // namespace

struct ParquetText {
  std::string path, column;
  std::unique_ptr<parquet::ParquetFileReader> reader;
  std::shared_ptr<parquet::FileMetaData> meta;
  int col = -1;
  int16_t max_def = 0;  // definition level of a present value (0: the column is required)
  int row_group = -1;   // the row group being read
  std::shared_ptr<parquet::RowGroupReader> rg;
  std::shared_ptr<parquet::ByteArrayReader> cr;
  int64_t rows_total = 0, rows_read = 0;
  uint64_t file_size = 0;
  std::vector<int16_t> def;
  std::vector<parquet::ByteArray> values;
};

static int fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (err && errlen) vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return -1;
}

// The file's top-level column names, for an error message.
static std::string column_names(const parquet::SchemaDescriptor *schema) {
  std::string names;
  const parquet::schema::GroupNode *root = schema->group_node();
  for (int i = 0; i < root->field_count() && names.size() < 300; i++) names += (i ? ", " : "") + root->field(i)->name();
  return names;
}

static int open_checked(ParquetText *p, char *err, size_t errlen) {
  parquet::ReaderProperties props = parquet::default_reader_properties();
  props.enable_buffered_stream();  // read a column chunk's pages 1 MB at a time, not the chunk whole
  props.set_buffer_size(kReadBuffer);
  props.set_page_checksum_verification(true);  // where the writer stored page CRCs
  p->reader = parquet::ParquetFileReader::OpenFile(p->path, false, props);
  p->meta = p->reader->metadata();
  const parquet::SchemaDescriptor *schema = p->meta->schema();
  p->col = schema->ColumnIndex(p->column);
  if (p->col < 0)
    return fail(err, errlen, "%s: no column \"%s\" (its columns: %s); name the text column with --text-field",
                p->path.c_str(), p->column.c_str(), column_names(schema).c_str());
  const parquet::ColumnDescriptor *d = schema->Column(p->col);
  const std::shared_ptr<const parquet::LogicalType> &lt = d->logical_type();
  int text_type = !lt || lt->is_none() || lt->is_string() || lt->is_JSON() || lt->is_enum();  // not decimal, uuid...
  if (d->physical_type() != parquet::Type::BYTE_ARRAY || !text_type || d->max_repetition_level() > 0)
    return fail(err, errlen, "%s: column \"%s\" holds %s%s, not strings", p->path.c_str(), p->column.c_str(),
                d->max_repetition_level() > 0 ? "lists of " : "",
                lt && !lt->is_none() ? lt->ToString().c_str() : parquet::TypeToString(d->physical_type()).c_str());
  p->max_def = d->max_definition_level();
  p->rows_total = p->meta->num_rows();
  return 0;
}

ParquetText *parquet_text_open(const char *path, const char *column, char *err, size_t errlen) {
  ParquetText *p = new ParquetText;
  p->path = path, p->column = column;
  int rc;
  try {
    rc = open_checked(p, err, errlen);
    FILE *f = rc ? nullptr : fopen(path, "rb");
    if (f && fseek(f, 0, SEEK_END) == 0) p->file_size = (uint64_t)ftell(f);
    if (f) fclose(f);
  } catch (const std::exception &e) {
    rc = fail(err, errlen, "%s: cannot read it as parquet: %s", path, e.what());
  }
  if (rc) {
    delete p;
    return nullptr;
  }
  return p;
}

static void append_row(TextBlock *b, const uint8_t *s, size_t n) {
  if (b->len + n > b->cap) {
    size_t cap = 2 * b->cap > b->len + n ? 2 * b->cap : b->len + n;
    char *bigger = static_cast<char *>(realloc(b->bytes, cap));
    if (!bigger) throw std::bad_alloc();
    b->bytes = bigger, b->cap = cap;
  }
  if (b->n_rows == b->rows_cap) {
    size_t cap = b->rows_cap ? 2 * b->rows_cap : 1024;
    size_t *bigger = static_cast<size_t *>(realloc(b->ends, cap * sizeof(size_t)));
    if (!bigger) throw std::bad_alloc();
    b->ends = bigger, b->rows_cap = cap;
  }
  if (n) memcpy(b->bytes + b->len, s, n);
  b->len += n;
  b->ends[b->n_rows++] = b->len;
}

static int read_rows(ParquetText *p, TextBlock *b, size_t target) {
  p->def.resize(kRowsPerBatch), p->values.resize(kRowsPerBatch);
  while (b->len < target || b->n_rows == 0) {
    if (!p->cr || !p->cr->HasNext()) {
      if (p->row_group + 1 >= p->meta->num_row_groups()) break;
      p->rg = p->reader->RowGroup(++p->row_group);
      p->cr = std::static_pointer_cast<parquet::ByteArrayReader>(p->rg->Column(p->col));
      continue;
    }
    int64_t got = 0;  // values (non-null rows) read
    int64_t rows =
        p->cr->ReadBatch(kRowsPerBatch, p->max_def ? p->def.data() : nullptr, nullptr, p->values.data(), &got);
    for (int64_t i = 0, v = 0; i < rows; i++) {
      if (p->max_def && p->def[i] < p->max_def) append_row(b, nullptr, 0);  // null: an empty document
      else append_row(b, p->values[v].ptr, p->values[v].len), v++;
    }
    p->rows_read += rows;
  }
  return b->n_rows > 0;
}

int parquet_text_read(ParquetText *p, TextBlock *b, size_t target, char *err, size_t errlen) {
  b->len = 0, b->n_rows = 0;
  try {
    return read_rows(p, b, target);
  } catch (const std::exception &e) {
    return fail(err, errlen, "%s: column \"%s\", row group %d: %s", p->path.c_str(), p->column.c_str(), p->row_group,
                e.what());
  }
}

uint64_t parquet_text_position(const ParquetText *p) {
  return p->rows_total > 0 ? (uint64_t)((double)p->file_size * (double)p->rows_read / (double)p->rows_total) : 0;
}

void parquet_text_close(ParquetText *p) { delete p; }
