"""A corpus of JSON Schemas for structured-output work: the bench's workload, the grammar engines'
benchmark and the tests' coverage (every output must validate with the ``jsonschema`` package).

They cover what agent frameworks send: nested objects, arrays with bounds, enums and consts,
``anyOf`` / ``oneOf``, numeric bounds, string patterns and formats, required and optional fields,
``$defs`` references. Strings carry ``maxLength``, arrays ``maxItems`` and numbers bounds and a ``multipleOf`` (exact in
binary, so ``jsonschema`` checks it exactly) where a model that never closes them (a random-weight
one, say) would otherwise run to ``max_tokens``: every document of these schemas fits in a few
hundred tokens.
"""

from __future__ import annotations

_NAME = {"type": "string", "minLength": 1, "maxLength": 12}
_SHORT = {"type": "string", "maxLength": 16}
_COUNT = {"type": "integer", "minimum": 0, "maximum": 1000}

SCHEMAS: dict[str, dict] = {
    "flat_object": {
        "type": "object",
        "properties": {"name": _NAME, "age": {"type": "integer", "minimum": 0, "maximum": 150}},
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    "optional_fields": {
        "type": "object",
        "properties": {"title": _NAME, "subtitle": _SHORT, "pages": _COUNT},
        "required": ["title"],
        "additionalProperties": False,
    },
    "booleans": {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "retry": {"type": "boolean"}},
        "required": ["ok", "retry"],
        "additionalProperties": False,
    },
    "enum_string": {
        "type": "object",
        "properties": {"mood": {"enum": ["happy", "sad", "angry", "calm"]}},
        "required": ["mood"],
        "additionalProperties": False,
    },
    "enum_mixed": {
        "type": "object",
        "properties": {"level": {"enum": [1, 2, 3, "max", None, True]}},
        "required": ["level"],
        "additionalProperties": False,
    },
    "const": {
        "type": "object",
        "properties": {"version": {"const": "v1"}, "kind": {"const": 7}},
        "required": ["version", "kind"],
        "additionalProperties": False,
    },
    "int_bounds": {
        "type": "object",
        "properties": {"temperature": {"type": "integer", "minimum": -40, "maximum": 50}},
        "required": ["temperature"],
        "additionalProperties": False,
    },
    "int_exclusive": {
        "type": "object",
        "properties": {"n": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 100}},
        "required": ["n"],
        "additionalProperties": False,
    },
    "number_bounds": {
        "type": "object",
        "properties": {"score": {"type": "number", "minimum": 0, "maximum": 1, "multipleOf": 0.125}},
        "required": ["score"],
        "additionalProperties": False,
    },
    "number_steps": {
        "type": "object",
        "properties": {
            "x": {"type": "number", "minimum": -1000, "maximum": 1000, "multipleOf": 0.5},
            "y": {"type": "number", "exclusiveMinimum": -10, "maximum": 10, "multipleOf": 0.25},
        },
        "required": ["x", "y"],
        "additionalProperties": False,
    },
    "string_pattern_code": {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}},
        "required": ["code"],
        "additionalProperties": False,
    },
    "string_pattern_phone": {
        "type": "object",
        "properties": {"phone": {"type": "string", "pattern": "^\\+?[0-9]{7,12}$"}},
        "required": ["phone"],
        "additionalProperties": False,
    },
    "string_lengths": {
        "type": "object",
        "properties": {"tag": {"type": "string", "minLength": 2, "maxLength": 5}},
        "required": ["tag"],
        "additionalProperties": False,
    },
    "string_format_date": {
        "type": "object",
        "properties": {"day": {"type": "string", "format": "date"}},
        "required": ["day"],
        "additionalProperties": False,
    },
    "array_of_ints": {
        "type": "object",
        "properties": {"values": {"type": "array", "items": _COUNT, "minItems": 1, "maxItems": 4}},
        "required": ["values"],
        "additionalProperties": False,
    },
    "array_of_strings": {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": _SHORT, "maxItems": 3}},
        "required": ["tags"],
        "additionalProperties": False,
    },
    "array_exact": {
        "type": "object",
        "properties": {
            "rgb": {
                "type": "array",
                "items": {"type": "integer", "minimum": 0, "maximum": 255},
                "minItems": 3,
                "maxItems": 3,
            }
        },
        "required": ["rgb"],
        "additionalProperties": False,
    },
    "array_of_objects": {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "maxItems": 3,
                "items": {
                    "type": "object",
                    "properties": {"sku": _NAME, "qty": {"type": "integer", "minimum": 1, "maximum": 9}},
                    "required": ["sku", "qty"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["items"],
        "additionalProperties": False,
    },
    "array_enum_items": {
        "type": "object",
        "properties": {"days": {"type": "array", "items": {"enum": ["mon", "tue", "wed"]}, "maxItems": 3}},
        "required": ["days"],
        "additionalProperties": False,
    },
    "tuple_prefix_items": {
        "type": "object",
        "properties": {
            "point": {
                "type": "array",
                "prefixItems": [{"type": "integer", "minimum": 0, "maximum": 9}, {"enum": ["N", "S"]}],
                "items": False,
            }
        },
        "required": ["point"],
        "additionalProperties": False,
    },
    "nested_two": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {"id": _COUNT, "name": _NAME},
                "required": ["id", "name"],
                "additionalProperties": False,
            }
        },
        "required": ["user"],
        "additionalProperties": False,
    },
    "nested_three": {
        "type": "object",
        "properties": {
            "order": {
                "type": "object",
                "properties": {
                    "address": {
                        "type": "object",
                        "properties": {"city": _NAME, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                        "required": ["city", "zip"],
                        "additionalProperties": False,
                    },
                    "express": {"type": "boolean"},
                },
                "required": ["address", "express"],
                "additionalProperties": False,
            }
        },
        "required": ["order"],
        "additionalProperties": False,
    },
    "any_of_scalar": {
        "type": "object",
        "properties": {"value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 99}, {"type": "boolean"}]}},
        "required": ["value"],
        "additionalProperties": False,
    },
    "any_of_objects": {
        "type": "object",
        "properties": {
            "shape": {
                "anyOf": [
                    {
                        "type": "object",
                        "properties": {"kind": {"const": "circle"}, "r": _COUNT},
                        "required": ["kind", "r"],
                        "additionalProperties": False,
                    },
                    {
                        "type": "object",
                        "properties": {"kind": {"const": "square"}, "side": _COUNT},
                        "required": ["kind", "side"],
                        "additionalProperties": False,
                    },
                ]
            }
        },
        "required": ["shape"],
        "additionalProperties": False,
    },
    "one_of": {
        "type": "object",
        "properties": {
            "id": {
                "oneOf": [{"type": "string", "pattern": "^u[0-9]{3}$"}, {"type": "integer", "minimum": 0, "maximum": 9}]
            }
        },
        "required": ["id"],
        "additionalProperties": False,
    },
    "nullable": {
        "type": "object",
        "properties": {"note": {"type": ["string", "null"], "maxLength": 10}},
        "required": ["note"],
        "additionalProperties": False,
    },
    "type_union": {
        "type": "object",
        "properties": {"v": {"type": ["integer", "boolean"], "minimum": 0, "maximum": 5}},
        "required": ["v"],
        "additionalProperties": False,
    },
    "defs_ref": {
        "$defs": {
            "person": {
                "type": "object",
                "properties": {"name": _NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
                "required": ["name", "age"],
                "additionalProperties": False,
            }
        },
        "type": "object",
        "properties": {"author": {"$ref": "#/$defs/person"}, "editor": {"$ref": "#/$defs/person"}},
        "required": ["author"],
        "additionalProperties": False,
    },
    "weather_tool_args": {
        "type": "object",
        "properties": {
            "city": _NAME,
            "unit": {"enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
    "booking": {
        "type": "object",
        "properties": {
            "restaurant": _NAME,
            "party_size": {"type": "integer", "minimum": 1, "maximum": 12},
            "time": {"type": "string", "pattern": "^([01][0-9]|2[0-3]):[0-5][0-9]$"},
            "notes": _SHORT,
        },
        "required": ["restaurant", "party_size", "time"],
        "additionalProperties": False,
    },
    "order_lookup": {
        "type": "object",
        "properties": {"order_id": {"type": "string", "pattern": "^ORD[0-9]{6}$"}, "verbose": {"type": "boolean"}},
        "required": ["order_id"],
        "additionalProperties": False,
    },
    "classification": {
        "type": "object",
        "properties": {
            "label": {"enum": ["spam", "ham"]},
            "confidence": {"type": "number", "minimum": 0, "maximum": 1, "multipleOf": 0.25},
        },
        "required": ["label", "confidence"],
        "additionalProperties": False,
    },
    "sentiment_list": {
        "type": "object",
        "properties": {
            "results": {
                "type": "array",
                "minItems": 1,
                "maxItems": 3,
                "items": {
                    "type": "object",
                    "properties": {"sentence": _SHORT, "sentiment": {"enum": ["pos", "neg", "neu"]}},
                    "required": ["sentence", "sentiment"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["results"],
        "additionalProperties": False,
    },
    "matrix": {
        "type": "object",
        "properties": {
            "rows": {
                "type": "array",
                "maxItems": 2,
                "items": {"type": "array", "maxItems": 2, "items": {"type": "integer", "minimum": 0, "maximum": 9}},
            }
        },
        "required": ["rows"],
        "additionalProperties": False,
    },
    "event": {
        "type": "object",
        "properties": {
            "name": _NAME,
            "start": {"type": "string", "format": "date"},
            "attendees": {"type": "array", "items": _NAME, "maxItems": 2},
            "public": {"type": "boolean"},
        },
        "required": ["name", "start", "public"],
        "additionalProperties": False,
    },
    "product": {
        "type": "object",
        "properties": {
            "sku": {"type": "string", "pattern": "^[a-z]{2}[0-9]{2}$"},
            "price": {"type": "number", "minimum": 0, "maximum": 999, "multipleOf": 0.5},
            "stock": _COUNT,
            "category": {"enum": ["book", "toy", "food"]},
        },
        "required": ["sku", "price", "category"],
        "additionalProperties": False,
    },
    "address_book": {
        "type": "object",
        "properties": {
            "contacts": {
                "type": "array",
                "maxItems": 2,
                "items": {
                    "type": "object",
                    "properties": {
                        "name": _NAME,
                        "email": {"type": "string", "pattern": "^[a-z]{1,6}@[a-z]{1,6}\\.com$"},
                    },
                    "required": ["name"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["contacts"],
        "additionalProperties": False,
    },
    "top_level_array": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 4},
    "top_level_enum": {"enum": ["yes", "no", "maybe"]},
    "top_level_integer": {"type": "integer", "minimum": 10, "maximum": 20},
    "top_level_boolean": {"type": "boolean"},
    "all_optional": {
        "type": "object",
        "properties": {"a": {"type": "boolean"}, "b": {"enum": ["x", "y"]}},
        "additionalProperties": False,
    },
    "recipe": {
        "type": "object",
        "properties": {
            "title": _NAME,
            "servings": {"type": "integer", "minimum": 1, "maximum": 8},
            "steps": {"type": "array", "items": _SHORT, "minItems": 1, "maxItems": 3},
            "vegan": {"type": "boolean"},
            "difficulty": {"enum": ["easy", "medium", "hard"]},
        },
        "required": ["title", "servings", "steps", "difficulty"],
        "additionalProperties": False,
    },
    "calendar_slot": {
        "type": "object",
        "properties": {
            "weekday": {"enum": ["mon", "tue", "wed", "thu", "fri"]},
            "hour": {"type": "integer", "minimum": 8, "maximum": 18},
            "length_min": {"enum": [15, 30, 60]},
        },
        "required": ["weekday", "hour", "length_min"],
        "additionalProperties": False,
    },
}
