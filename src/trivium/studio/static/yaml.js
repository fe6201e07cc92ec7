// A YAML writer for configs (mappings, lists, scalars): the builder's preview and download. Strings are
// written as JSON strings when plain YAML could misread them (JSON strings are valid YAML scalars).

const PLAIN = /^[A-Za-z_./][\w./-]*$/;
const RESERVED = /^(true|false|yes|no|on|off|null|~|y|n)$/i;

function scalar(value) {
  if (value === null || value === undefined) return "null";
  if (typeof value === "number" || typeof value === "boolean") return String(value);
  const text = String(value);
  return PLAIN.test(text) && !RESERVED.test(text) ? text : JSON.stringify(text);
}

function isEmpty(value) {
  return (Array.isArray(value) && value.length === 0) || (value && typeof value === "object" && !Array.isArray(value) && Object.keys(value).length === 0);
}

export function toYaml(value, indent = "") {
  if (Array.isArray(value)) {
    if (value.length === 0) return "[]";
    return value.map((item) => {
      if (item && typeof item === "object" && !isEmpty(item)) {
        const inner = toYaml(item, indent + "  ");
        return `${indent}- ${inner.slice(indent.length + 2)}`;
      }
      return `${indent}- ${isEmpty(item) ? (Array.isArray(item) ? "[]" : "{}") : scalar(item)}`;
    }).join("\n");
  }
  if (value && typeof value === "object") {
    const keys = Object.keys(value);
    if (keys.length === 0) return "{}";
    return keys.map((key) => {
      const item = value[key];
      if (item && typeof item === "object" && !isEmpty(item)) return `${indent}${scalar(key)}:\n${toYaml(item, indent + "  ")}`;
      return `${indent}${scalar(key)}: ${isEmpty(item) ? (Array.isArray(item) ? "[]" : "{}") : scalar(item)}`;
    }).join("\n");
  }
  return indent + scalar(value);
}
