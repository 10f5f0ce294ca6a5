"""Draw a terminal capture (``tmux capture-pane -e -p``: text with SGR colour escapes) to a PNG.

    python editors/tools/ansi_png.py pane.ans out.png [CURSOR_X,CURSOR_Y]

Handles what Neovim sends: 16/256/24-bit colours, bold, italic, underline, reverse. Needs Pillow
and the DejaVu Sans Mono font (Debian: fonts-dejavu-core).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

FONT_DIR = Path("/usr/share/fonts/truetype/dejavu")
FONTS = {
    (False, False): "DejaVuSansMono.ttf",
    (True, False): "DejaVuSansMono-Bold.ttf",
    (False, True): "DejaVuSansMono-Oblique.ttf",
    (True, True): "DejaVuSansMono-BoldOblique.ttf",
}
SIZE = 15
PAD = 10
DEFAULT_FG = (224, 226, 234)  # Neovim's default dark scheme: NvimLightGrey2 on NvimDarkGrey2
DEFAULT_BG = (20, 22, 27)
BASE16 = [
    (0, 0, 0), (205, 49, 49), (13, 188, 121), (229, 229, 16), (36, 114, 200), (188, 63, 188),
    (17, 168, 205), (229, 229, 229), (102, 102, 102), (241, 76, 76), (35, 209, 139), (245, 245, 67),
    (59, 142, 234), (214, 112, 214), (41, 184, 219), (255, 255, 255),
]
SGR = re.compile(r"\x1b\[([0-9;:]*)m")
RGB = tuple[int, int, int]


def xterm256(n: int) -> RGB:
    if n < 16:
        return BASE16[n]
    if n < 232:
        n -= 16
        steps = [0, 95, 135, 175, 215, 255]
        return steps[n // 36], steps[(n // 6) % 6], steps[n % 6]
    level = 8 + 10 * (n - 232)
    return level, level, level


@dataclass(frozen=True)
class Style:
    fg: RGB | None = None
    bg: RGB | None = None
    bold: bool = False
    italic: bool = False
    underline: bool = False
    reverse: bool = False


def extended_colour(codes: list[int], i: int) -> tuple[RGB | None, int]:
    """The colour of ``38;5;n`` / ``38;2;r;g;b`` starting at codes[i] (the 5 or 2); the next index."""
    if i < len(codes) and codes[i] == 5 and i + 1 < len(codes):
        return xterm256(codes[i + 1]), i + 2
    if i < len(codes) and codes[i] == 2 and i + 3 < len(codes):
        return (codes[i + 1], codes[i + 2], codes[i + 3]), i + 4
    return None, len(codes)


def apply(style: Style, params: str) -> Style:
    codes = [int(c) if c else 0 for c in re.split("[;:]", params)] if params else [0]
    i = 0
    while i < len(codes):
        code, i = codes[i], i + 1
        if code == 0:
            style = Style()
        elif code in (1, 22):
            style = replace(style, bold=code == 1)
        elif code in (3, 23):
            style = replace(style, italic=code == 3)
        elif code in (4, 24):
            style = replace(style, underline=code == 4)
        elif code in (7, 27):
            style = replace(style, reverse=code == 7)
        elif 30 <= code <= 37 or 90 <= code <= 97:
            style = replace(style, fg=BASE16[code - 30 if code < 90 else code - 82])
        elif 40 <= code <= 47 or 100 <= code <= 107:
            style = replace(style, bg=BASE16[code - 40 if code < 100 else code - 92])
        elif code in (38, 48):
            colour, i = extended_colour(codes, i)
            style = replace(style, fg=colour) if code == 38 else replace(style, bg=colour)
        elif code == 39:
            style = replace(style, fg=None)
        elif code == 49:
            style = replace(style, bg=None)
    return style


def cells(text: str) -> list[list[tuple[str, Style]]]:
    """Each line as (character, style) cells."""
    rows = []
    for line in text.rstrip("\n").split("\n"):
        style, row, at = Style(), [], 0
        for match in SGR.finditer(line):
            row += [(ch, style) for ch in line[at:match.start()]]
            style, at = apply(style, match.group(1)), match.end()
        row += [(ch, style) for ch in line[at:]]
        rows.append(row)
    return rows


def render(text: str, out: Path, cursor: tuple[int, int] | None = None) -> None:
    fonts = {key: ImageFont.truetype(str(FONT_DIR / name), SIZE) for key, name in FONTS.items()}
    cell_w = round(fonts[False, False].getlength("M"))
    cell_h = round(SIZE * 1.35)
    rows = cells(text)
    width = max(len(r) for r in rows)
    image = Image.new("RGB", (width * cell_w + 2 * PAD, len(rows) * cell_h + 2 * PAD), DEFAULT_BG)
    draw = ImageDraw.Draw(image)
    for y, row in enumerate(rows):
        # a row's last background runs to the edge, as in the terminal
        last_bg = row[-1][1].bg if row else None
        if last_bg and not row[-1][1].reverse:
            top = PAD + y * cell_h
            draw.rectangle([PAD + len(row) * cell_w, top, image.width, top + cell_h], last_bg)
        for x, (ch, style) in enumerate(row):
            fg, bg = style.fg or DEFAULT_FG, style.bg or DEFAULT_BG
            if style.reverse:
                fg, bg = bg, fg
            left, top = PAD + x * cell_w, PAD + y * cell_h
            draw.rectangle([left, top, left + cell_w, top + cell_h], bg)
            if ch != " ":
                draw.text((left, top + 2), ch, fill=fg, font=fonts[style.bold, style.italic])
            if style.underline:
                draw.line([left, top + cell_h - 2, left + cell_w, top + cell_h - 2], fg)
    if cursor is not None:  # Insert mode's bar cursor
        left, top = PAD + cursor[0] * cell_w, PAD + cursor[1] * cell_h
        draw.rectangle([left, top + 1, left + 1, top + cell_h - 1], DEFAULT_FG)
    image.save(out, optimize=True)


if __name__ == "__main__":
    source, target = sys.argv[1:3]
    at = None
    if len(sys.argv) > 3:
        x, y = sys.argv[3].split(",")
        at = (int(x), int(y))
    render(Path(source).read_text(encoding="utf-8"), Path(target), at)
