"""Test documents: small real PDFs (written by pypdf, or laid out here byte for byte with a
correct cross-reference table), an encrypted one, a corrupt one, and a decompression bomb."""

from __future__ import annotations

import io
import zlib

from pypdf import PdfReader, PdfWriter


def text_pdf(*pages: str) -> bytes:
    """A PDF with one text line per page (Helvetica), which pypdf extracts back."""
    objects: list[bytes] = []
    page_ids = []
    font_id = 3 + 2 * len(pages)
    for number, text in enumerate(pages):
        content_id = 4 + 2 * number
        escaped = text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
        stream = f"BT /F1 12 Tf 72 720 Td ({escaped}) Tj ET".encode()
        page_ids.append(3 + 2 * number)
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {content_id} 0 R"
            f" /Resources << /Font << /F1 {font_id} 0 R >> >> >>".encode()
        )
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    kids = " ".join(f"{i} 0 R" for i in page_ids)
    head = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        f"<< /Type /Pages /Kids [{kids}] /Count {len(pages)} >>".encode(),
    ]
    font = b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"
    return _assemble([*head, *objects, font])


def bomb_pdf(inflated_bytes: int = 200_000_000) -> bytes:
    """A one-page PDF whose content stream inflates to ``inflated_bytes`` of spaces."""
    compressor = zlib.compressobj(9)
    chunk = b"BT /F1 12 Tf (x) Tj ET " * 40_000
    parts = [compressor.compress(chunk) for _ in range(inflated_bytes // len(chunk))]
    stream = b"".join(parts) + compressor.flush()
    return _assemble(
        [
            b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R"
            b" /Resources << /Font << /F1 5 0 R >> >> >>",
            b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(stream)
            + stream
            + b"\nendstream",
            b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        ]
    )


def encrypted_pdf(text: str = "a secret") -> bytes:
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(text_pdf(text))))
    writer.encrypt(user_password="open sesame", algorithm="AES-128")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def corrupt_pdf() -> bytes:
    """The head of a PDF and then noise: no cross-reference table, no trailer."""
    return text_pdf("cut short")[:60] + bytes(range(256)) * 8


def _assemble(objects: list[bytes]) -> bytes:
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    for offset in offsets:
        out += b"%010d 00000 n \n" % offset
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )
    return bytes(out)


# ------------------------------------------------------------------ hostile documents (issue 17)


def nesting_bomb_html(levels: int) -> bytes:
    """A paragraph at every nesting level: ``<div><p>…</p><div><p>…</p>…``. A parser that walks
    up to the root for every paragraph spends time quadratic in ``levels``."""
    return b"<html><body>" + b"<div><p>level</p>" * levels + b"</div>" * levels + b"</body></html>"


def flat_tags_html(size: int) -> bytes:
    """``size`` bytes of empty inline tags that are never closed: a tree of one node per tag."""
    return b"<b>" * (size // 3)


def shared_stream_pdf(
    pages: int, stream_bytes: int = 100_000, text_lines: int | None = None
) -> bytes:
    """``pages`` pages that all draw one content stream of about ``stream_bytes``: small on
    disk, but a reader that parses the stream once per page parses it ``pages`` times.
    ``text_lines``: that many lines of text, the rest of the stream drawing (default: all text).
    """
    text = b"BT /F1 12 Tf 72 720 Td (shared) Tj ET\n"
    drawing = b"0 0 m 100 100 l S\n"
    if text_lines is None:
        stream = text * (stream_bytes // len(text))
    else:
        stream = text * text_lines + drawing * (stream_bytes // len(drawing))
    page_ids = list(range(5, 5 + pages))
    kids = b" ".join(b"%d 0 R" % i for i in page_ids)
    page = (
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 3 0 R"
        b" /Resources << /Font << /F1 4 0 R >> >> >>"
    )
    return _assemble(
        [
            b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, pages),
            b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
            b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
            *([page] * pages),
        ]
    )


def memory_bomb_pdf(pages: int = 40, inflated_bytes: int = 20_000_000) -> bytes:
    """``pages`` pages, each drawing its own stream that inflates to ``inflated_bytes`` of
    blanks, each under the per-stream inflate limit: the reader keeps every inflated stream."""
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [%s] /Count %d >>"
        % (b" ".join(b"%d 0 R" % (4 + 2 * i) for i in range(pages)), pages),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    for number in range(pages):
        compressor = zlib.compressobj(9)
        blank = b" " * 1_000_000
        body = b"".join(compressor.compress(blank) for _ in range(inflated_bytes // len(blank)))
        stream = compressor.compress(b"%d" % number) + body + compressor.flush()
        objects.append(
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents %d 0 R"
            b" /Resources << /Font << /F1 3 0 R >> >> >>" % (5 + 2 * number)
        )
        objects.append(
            b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(stream)
            + stream
            + b"\nendstream"
        )
    return _assemble(objects)
