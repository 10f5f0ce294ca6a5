"""Golden cases for the context builder and post-processing, one or more per language.

Each case is a document with the cursor marked ``‸``, a token budget small enough that trimming
shows, the prompt the builder must produce (``⟨...⟩`` marks the text backed up for token healing,
which the model must write first), what the model decodes (after that text, as the engine
returns it), and the item the editor gets: its insert text and the range it replaces
(line, start character, end character; UTF-16).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Golden:
    uri: str
    source: str  # with "‸" at the cursor
    budget: int
    prompt: str  # the prompt text, then the healed text in ⟨⟩
    decoded: str  # the engine's text (after the healed text)
    item: str | None  # the insert text (None: no item)
    range: tuple[int, int, int] | None = None  # line, start, end


PYTHON = '''import json
import os
from collections import OrderedDict


def load(path):
    with open(path) as f:
        return json.load(f)


def save(path, data):
    with open(path, "w") as f:
        json.dump(data, f, indent=2)


class Cache:
    """A small LRU cache."""

    def __init__(self, size=128):
        self.size = size
        self.items = OrderedDict()

    def get(self, key):
        if key not in self.items:
            return None
        self.items.move_to_end(key)
        return self.items[key]

    def put(self, key, value):
        self.items[key] = value
        self.items.move_to_end(key)
        if len(self.items) > self.size:
            self.items.popitem(las‸)
'''

JAVASCRIPT = """const fs = require('fs')
const path = require('path')

function readJson (file) {
  return JSON.parse(fs.readFileSync(file, 'utf8'))
}

function writeJson (file, data) {
  fs.writeFileSync(file, JSON.stringify(data, null, 2))
}

class Registry {
  constructor (root) {
    this.root = root
    this.packages = new Map()
  }

  load (name) {
    const file = path.join(this.root, name, 'package.json')
    const pkg = readJson(file)
    this.packages.set(name, ‸)
  }
}
"""

TYPESCRIPT = """import { readFile } from "fs/promises";
import type { Config } from "./config";

export interface User {
  id: number;
  name: string;
  email?: string;
}

function formatName(user: User): string {
  return user.name.trim();
}

export class UserStore {
  private users = new Map<number, User>();

  constructor(private readonly config: Config) {}

  async load(file: string): Promise<void> {
    const raw = await readFile(file, "utf8");
    for (const user of JSON.parse(raw) as User[]) {
      this.users.set(user.id, ‸);
    }
  }
}
"""

GO = """package store

import (
\t"errors"
\t"sync"
)

var ErrNotFound = errors.New("not found")

type Item struct {
\tKey   string
\tValue []byte
}

func newItem(key string, value []byte) *Item {
\treturn &Item{Key: key, Value: value}
}

type Store struct {
\tmu    sync.Mutex
\titems map[string]*Item
}

func (s *Store) Get(key string) (*Item, error) {
\ts.mu.Lock()
\tdefer s.mu.Unlock()
\titem, ok := s.items[key]
\tif !ok {
\t\treturn nil, ‸
\t}
\treturn item, nil
}
"""

RUST = """use std::collections::HashMap;
use std::fmt;

#[derive(Debug)]
pub enum Error {
    Missing(String),
    Invalid { line: usize },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self)
    }
}

pub struct Config {
    values: HashMap<String, String>,
}

impl Config {
    pub fn new() -> Self {
        Config { values: HashMap::new() }
    }

    pub fn get(&self, key: &str) -> Result<&String, Error> {
        self.values.get(key).ok_or_else(|| Error::Missing(key.to_stri‸))
    }
}
"""

JAVA = """package org.example.cache;

import java.util.HashMap;
import java.util.Map;

public class Counter {
    private final Map<String, Integer> counts = new HashMap<>();

    public int total() {
        int sum = 0;
        for (int value : counts.values()) {
            sum += value;
        }
        return sum;
    }

    public void add(String key) {
        counts.merge(key, 1, Integer::sum);
    }

    public int get(String key) {
        return counts.getOrDefault(key, ‸);
    }
}
"""

C = """#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct buffer {
    char *data;
    size_t len;
    size_t cap;
};

static void die(const char *message)
{
    fprintf(stderr, "%s\\n", message);
    exit(1);
}

static void buffer_grow(struct buffer *b, size_t need)
{
    if (b->len + need <= b->cap)
        return;
    while (b->cap < b->len + need)
        b->cap = b->cap ? b->cap * 2 : 64;
    b->data = realloc(b->data, b->cap);
    if (!b->data)
        die("out of ‸");
}
"""

CPP = """#include <string>
#include <vector>

namespace text {

std::string join(const std::vector<std::string>& parts, char sep) {
    std::string out;
    for (size_t i = 0; i < parts.size(); ++i) {
        if (i) out += sep;
        out += parts[i];
    }
    return out;
}

class Tokenizer {
  public:
    explicit Tokenizer(std::string source) : source_(std::move(source)) {}

    std::vector<std::string> words() const {
        std::vector<std::string> result;
        std::string current;
        for (char c : source_) {
            if (c == ' ') {
                result.push_back(‸);
            }
        }
        return result;
    }

  private:
    std::string source_;
};

}  // namespace text
"""

PYTHON_PROMPT = '''import json
import os
from collections import OrderedDict


class Cache:
    """A small LRU cache."""

    def put(self, key, value):
        self.items[key] = value
        self.items.move_to_end(key)
        if len(self.items) > self.size:
            self.items.popitem(⟨las⟩'''

JAVASCRIPT_PROMPT = """const fs = require('fs')
const path = require('path')

class Registry {
  constructor (root) {
    this.root = root
    this.packages = new Map()
  }

  load (name) {
    const file = path.join(this.root, name, 'package.json')
    const pkg = readJson(file)
    this.packages.set(name,⟨ ⟩"""

TYPESCRIPT_PROMPT = """import { readFile } from "fs/promises";
import type { Config } from "./config";

export class UserStore {

  constructor(private readonly config: Config) {}

  async load(file: string): Promise<void> {
    const raw = await readFile(file, "utf8");
    for (const user of JSON.parse(raw) as User[]) {
      this.users.set(user.id,⟨ ⟩"""

GO_PROMPT = """package store

import (
\t"errors"
\t"sync"
)

var ErrNotFound = errors.New("not found")

func (s *Store) Get(key string) (*Item, error) {
\ts.mu.Lock()
\tdefer s.mu.Unlock()
\titem, ok := s.items[key]
\tif !ok {
\t\treturn nil,⟨ ⟩"""

RUST_PROMPT = """use std::collections::HashMap;
use std::fmt;

pub struct Config {
    values: HashMap<String, String>,
}

impl Config {
    pub fn new() -> Self {
        Config { values: HashMap::new() }
    }

    pub fn get(&self, key: &str) -> Result<&String, Error> {
        self.values.get(key).ok_or_else(|| Error::Missing(key.to_⟨stri⟩"""

JAVA_PROMPT = """package org.example.cache;

import java.util.HashMap;
import java.util.Map;

public class Counter {
    private final Map<String, Integer> counts = new HashMap<>();

    public void add(String key) {
        counts.merge(key, 1, Integer::sum);
    }

    public int get(String key) {
        return counts.getOrDefault(key,⟨ ⟩"""

C_PROMPT = """#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void buffer_grow(struct buffer *b, size_t need)
{
    b->data = realloc(b->data, b->cap);
    if (!b->data)
        die("out of⟨ ⟩"""

CPP_PROMPT = """#include <string>
#include <vector>

namespace text {

class Tokenizer {
  public:

    std::vector<std::string> words() const {
        std::vector<std::string> result;
        std::string current;
        for (char c : source_) {
            if (c == ' ') {
                result.push_back(⟨⟩"""

CASES: list[Golden] = [
    Golden("file:///w/cache.py", PYTHON, 120, PYTHON_PROMPT, "t=False)", "t=False)", (32, 34, 35)),
    Golden("file:///w/registry.js", JAVASCRIPT, 120, JAVASCRIPT_PROMPT, "pkg)", "pkg)", (20, 28, 29)),
    Golden("file:///w/store.ts", TYPESCRIPT, 120, TYPESCRIPT_PROMPT, "user);", "user);", (21, 30, 32)),
    Golden("file:///w/store.go", GO, 120, GO_PROMPT, "ErrNotFound", "ErrNotFound", (28, 14, 14)),
    Golden("file:///w/config.rs", RUST, 120, RUST_PROMPT, "ng())))", "ng()))", (25, 69, 71)),
    Golden("file:///w/Counter.java", JAVA, 120, JAVA_PROMPT, "0);", "0);", (21, 40, 42)),
    Golden("file:///w/buffer.c", C, 120, C_PROMPT, 'memory");', 'memory");', (24, 20, 23)),
    Golden("file:///w/tokenizer.cpp", CPP, 120, CPP_PROMPT, "current)", "current);", (23, 33, 35)),
]
