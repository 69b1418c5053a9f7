#!/usr/bin/python3
"""Validate bnfold JSON reports against schema/report.schema.json.

A small JSON Schema (draft-07) validator: bnfold's dependencies include no JSON Schema library, so this covers
the keywords the report schema uses — $ref (local "#/..." pointers), type, enum, const, properties, required,
additionalProperties, items (one schema), minItems, maxItems, minimum, maximum, exclusiveMinimum,
exclusiveMaximum, minLength, maxLength, pattern, allOf, anyOf, oneOf, not, if/then/else and dependencies — and
refuses a schema that uses any other validation keyword, so nothing is silently ignored. When the `jsonschema`
module happens to be importable (Debian: python3-jsonschema), its Draft7Validator checks every report as well
and any disagreement is an error.

Usage: scripts/validate_report.py [--schema FILE] REPORT.json [REPORT.json ...]
Exit: 0 every report is valid; 1 a report is invalid (one line per problem: FILE: /json/pointer: problem);
2 usage error, unreadable file or unsupported schema.
"""

import argparse
import json
import math
import pathlib
import re
import sys

DEFAULT_SCHEMA = pathlib.Path(__file__).resolve().parent.parent / "schema" / "report.schema.json"

# Keywords that only annotate; everything else must be understood.
ANNOTATIONS = {"$schema", "$id", "$comment", "title", "description", "default", "examples", "definitions"}
VALIDATORS = {"$ref", "type", "enum", "const", "properties", "required", "additionalProperties", "items",
              "minItems", "maxItems", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength",
              "maxLength", "pattern", "allOf", "anyOf", "oneOf", "not", "if", "then", "else", "dependencies"}


class SchemaError(Exception):
    """The schema uses something this validator does not implement, or is malformed."""


def pointer(path):
    return "/" + "/".join(str(p).replace("~", "~0").replace("/", "~1") for p in path) if path else "/"


def is_type(value, name):
    if name == "null":
        return value is None
    if name == "boolean":
        return isinstance(value, bool)
    if name == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and math.isfinite(value) and value.is_integer())
    if name == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if name == "string":
        return isinstance(value, str)
    if name == "array":
        return isinstance(value, list)
    if name == "object":
        return isinstance(value, dict)
    raise SchemaError(f"unknown type '{name}'")


def json_equal(a, b):
    """JSON equality: 1 == 1.0, but true != 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


class Validator:
    def __init__(self, schema):
        self.root = schema

    def resolve(self, ref):
        if not ref.startswith("#"):
            raise SchemaError(f"only local $ref are supported, got '{ref}'")
        node = self.root
        for part in filter(None, ref[1:].split("/")):
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, list):
                node = node[int(part)]
            elif isinstance(node, dict) and part in node:
                node = node[part]
            else:
                raise SchemaError(f"$ref '{ref}' does not resolve")
        return node

    def errors(self, value, schema, path=()):
        """Yields (path, message) for every problem of `value` against `schema`."""
        if schema is True:
            return
        if schema is False:
            yield path, "no value is allowed here"
            return
        if not isinstance(schema, dict):
            raise SchemaError(f"schema at {pointer(path)} is not an object")
        unknown = set(schema) - ANNOTATIONS - VALIDATORS
        if unknown:
            raise SchemaError(f"unsupported keyword(s) {sorted(unknown)}")
        if "$ref" in schema:
            # Draft-07: a $ref replaces every sibling keyword.
            yield from self.errors(value, self.resolve(schema["$ref"]), path)
            return

        if "type" in schema:
            types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
            if not any(is_type(value, t) for t in types):
                yield path, f"expected {' or '.join(types)}, got {json.dumps(value)[:60]}"
                return
        if "enum" in schema and not any(json_equal(value, option) for option in schema["enum"]):
            yield path, f"{json.dumps(value)[:60]} is not one of {json.dumps(schema['enum'])}"
        if "const" in schema and not json_equal(value, schema["const"]):
            yield path, f"expected {json.dumps(schema['const'])}, got {json.dumps(value)[:60]}"

        if is_type(value, "number"):
            if "minimum" in schema and value < schema["minimum"]:
                yield path, f"{value} is below the minimum {schema['minimum']}"
            if "maximum" in schema and value > schema["maximum"]:
                yield path, f"{value} is above the maximum {schema['maximum']}"
            if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
                yield path, f"{value} is not above {schema['exclusiveMinimum']}"
            if "exclusiveMaximum" in schema and value >= schema["exclusiveMaximum"]:
                yield path, f"{value} is not below {schema['exclusiveMaximum']}"
        if isinstance(value, str):
            if "minLength" in schema and len(value) < schema["minLength"]:
                yield path, f"string shorter than {schema['minLength']}"
            if "maxLength" in schema and len(value) > schema["maxLength"]:
                yield path, f"string longer than {schema['maxLength']}"
            if "pattern" in schema and not re.search(schema["pattern"], value):
                yield path, f"'{value}' does not match {schema['pattern']}"
        if isinstance(value, list):
            if "minItems" in schema and len(value) < schema["minItems"]:
                yield path, f"fewer than {schema['minItems']} items"
            if "maxItems" in schema and len(value) > schema["maxItems"]:
                yield path, f"more than {schema['maxItems']} items"
            if "items" in schema:
                if isinstance(schema["items"], list):
                    raise SchemaError("tuple-form 'items' is not supported")
                for index, item in enumerate(value):
                    yield from self.errors(item, schema["items"], path + (index,))
        if isinstance(value, dict):
            properties = schema.get("properties", {})
            for name in schema.get("required", []):
                if name not in value:
                    yield path, f"missing required field '{name}'"
            for name, item in value.items():
                if name in properties:
                    yield from self.errors(item, properties[name], path + (name,))
                elif "additionalProperties" in schema:
                    extra = schema["additionalProperties"]
                    if extra is False:
                        yield path + (name,), "field not allowed here"
                    else:
                        yield from self.errors(item, extra, path + (name,))
            for name, dependency in schema.get("dependencies", {}).items():
                if name not in value:
                    continue
                if isinstance(dependency, list):
                    for other in dependency:
                        if other not in value:
                            yield path, f"'{name}' requires '{other}'"
                else:
                    yield from self.errors(value, dependency, path)

        for sub in schema.get("allOf", []):
            yield from self.errors(value, sub, path)
        if "anyOf" in schema and not any(self.valid(value, sub) for sub in schema["anyOf"]):
            yield path, "matches none of the allowed forms (anyOf)"
        if "oneOf" in schema:
            matches = sum(self.valid(value, sub) for sub in schema["oneOf"])
            if matches != 1:
                yield path, f"matches {matches} of the oneOf forms, expected exactly 1"
        if "not" in schema and self.valid(value, schema["not"]):
            yield path, "matches a form that is not allowed (not)"
        if "if" in schema:
            branch = "then" if self.valid(value, schema["if"]) else "else"
            if branch in schema:
                yield from self.errors(value, schema[branch], path)

    def valid(self, value, schema):
        return next(iter(self.errors(value, schema)), None) is None


def load_json(path):
    try:
        with open(path, encoding="utf-8") as stream:
            return json.load(stream)
    except (OSError, ValueError) as error:
        raise SystemExit(f"validate_report.py: {path}: cannot read JSON: {error}") from None


def main(argv):
    parser = argparse.ArgumentParser(description="Validate bnfold reports against the report JSON Schema.")
    parser.add_argument("--schema", default=str(DEFAULT_SCHEMA), help="schema file (default: %(default)s)")
    parser.add_argument("reports", nargs="+", metavar="REPORT.json")
    args = parser.parse_args(argv)

    schema = load_json(args.schema)
    validator = Validator(schema)
    try:
        import jsonschema  # optional cross-check; not a dependency
    except ImportError:
        reference = None
    else:
        try:
            jsonschema.Draft7Validator.check_schema(schema)
        except jsonschema.exceptions.SchemaError as error:
            print(f"validate_report.py: {args.schema}: not a draft-07 schema: {error.message}", file=sys.stderr)
            return 2
        reference = jsonschema.Draft7Validator(schema)

    invalid = False
    for path in args.reports:
        report = load_json(path)
        try:
            problems = list(validator.errors(report, schema))
        except SchemaError as error:
            print(f"validate_report.py: {args.schema}: {error}", file=sys.stderr)
            return 2
        for where, message in problems:
            print(f"{path}: {pointer(where)}: {message}")
        if reference is not None and reference.is_valid(report) != (not problems):
            print(f"{path}: this validator and jsonschema disagree "
                  f"({'valid' if not problems else 'invalid'} here, "
                  f"{'valid' if reference.is_valid(report) else 'invalid'} for jsonschema)")
            problems = problems or ["disagreement"]
        invalid = invalid or bool(problems)
    return 1 if invalid else 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except SystemExit as exit_:
        if isinstance(exit_.code, str):
            print(exit_.code, file=sys.stderr)
            sys.exit(2)
        raise
