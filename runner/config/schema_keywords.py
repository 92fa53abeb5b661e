"""Which keywords of a JSON schema llama-cpp-python's converter turns into grammar rules. It picks
one rule for each schema object, by the first of its keywords in a fixed order ($ref, oneOf/anyOf,
a list of types, const, enum, properties, allOf, items, pattern, format, min/maxLength, type), and
drops every other keyword of that object without a word: an answer could then break the schema (an
integer under "minimum": 0 come out -5; a date under "maxLength": 4 come out 10 characters long).
A schema with such a keyword is refused, naming it and where it is (runner/config/answer.py)."""

from __future__ import annotations

from typing import Any, Optional

from ..errors import quote

# Keywords that change no answer; $defs and definitions are read through the $refs that name them.
ANNOTATIONS = {"title", "description", "$schema", "$id", "$comment", "default", "examples", "readOnly",
               "writeOnly", "deprecated", "$defs", "definitions"}
# The `format` values it has rules for (llama_grammar.py's STRING_FORMAT_RULES and its uuid match);
# any other (email, uri, ipv4, int32, ...) gives the grammar of a plain string.
ENFORCED_FORMATS = {"date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4", "uuid5"}
_OBJECT = {"type", "properties", "required", "additionalProperties"}


def _rule_of(schema: dict[str, Any]) -> tuple[str, set[str]]:
    """(the keyword the converter makes this object's rule from, every keyword that rule reads),
    in the converter's own order (llama_grammar.py SchemaConverter.visit)."""
    kind = schema.get("type")
    if "$ref" in schema:
        return "$ref", {"$ref"}
    for union in ("oneOf", "anyOf"):
        if union in schema:
            return union, {union}
    if isinstance(kind, list):
        return "type", {"type"}
    for values in ("const", "enum"):  # the answer is one of the values given: a type beside them holds
        if values in schema:
            return values, {values, "type"}
    if kind in (None, "object") and ("properties" in schema or schema.get("additionalProperties", True) is not True):
        return "properties" if "properties" in schema else "additionalProperties", _OBJECT
    if kind in (None, "object") and "allOf" in schema:
        return "allOf", {"type", "allOf"}
    if kind in (None, "array") and (schema.get("items") or "prefixItems" in schema):
        items = "items" if schema.get("items") else "prefixItems"
        return items, {"type", items} | (set() if isinstance(schema[items], list) else {"minItems", "maxItems"})
    if kind in (None, "string") and "pattern" in schema:
        return "pattern", {"type", "pattern"}
    if kind in (None, "string") and schema.get("format") in ENFORCED_FORMATS:
        return "format", {"type", "format"}
    if kind == "string" and ("minLength" in schema or "maxLength" in schema):
        return "type", {"type", "minLength", "maxLength"}
    return "type", {"type"}


def _dropped_keyword(schema: dict[str, Any]) -> Optional[str]:
    """The first keyword of this schema object (not its children) the converter would drop, quoted,
    with the keyword whose rule took its place, or what it is read with."""
    decider, used = _rule_of(schema)
    for key, value in schema.items():
        if key in ANNOTATIONS or key in used:
            continue
        named = f"'format': {quote(value)}" if key == "format" else quote(key)
        if key not in READ_WITH or (key == "format" and value not in ENFORCED_FORMATS):
            return named  # no rule anywhere: minimum, uniqueItems, not, format: email, ...
        if decider != "type" or key == "type":
            return f"{named} beside {quote(decider)}"
        return f"{named} beside 'type': {quote(schema.get('type'))} (it is read only with {READ_WITH[key]})"
    return None


# The keywords the converter has rules for, each with what it must stand beside to be read.
READ_WITH = {**dict.fromkeys(("type", "$ref", "oneOf", "anyOf", "const", "enum"), "itself"),
             **dict.fromkeys(("properties", "additionalProperties", "allOf"), "'type': 'object' or none"),
             "required": "'properties'", "items": "'type': 'array' or none", "prefixItems": "'type': 'array' or none",
             "minItems": "'items'", "maxItems": "'items'", "pattern": "'type': 'string' or none",
             "format": "'type': 'string' or none", "minLength": "'type': 'string'", "maxLength": "'type': 'string'"}


def unenforced_keyword(schema: Any, at: str = "") -> Optional[str]:
    """Why a grammar cannot hold answers to this schema: the first keyword the converter ignores
    (minimum, uniqueItems, not, format: email, maxLength beside format, ...), with where it is;
    None when every keyword is enforced."""
    if not isinstance(schema, dict):
        return None
    dropped = _dropped_keyword(schema)
    if dropped is not None:
        return (f"the grammar cannot enforce {dropped}{f' (at {at[1:]})' if at else ''}, so answers could "
                "break the schema: leave it out (and check that part of the answers yourself)")
    children: list[tuple[str, Any]] = []
    for key in ("properties", "$defs", "definitions"):
        children += [(f"{at}.{key}.{k}", v) for k, v in (schema.get(key) or {}).items()]
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        children += [(f"{at}.{key}[{i}]", v) for i, v in enumerate(schema.get(key) or [])]
    for key in ("items", "additionalProperties"):
        children += [(f"{at}.{key}", schema.get(key))]
    for where, child in children:
        found = unenforced_keyword(child, where)
        if found is not None:
            return found
    return None
