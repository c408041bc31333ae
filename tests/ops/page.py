"""Reading the console's HTML in tests: links, forms and their fields, by plain parsing."""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser


@dataclass
class Form:
    """A ``<form>``: where it goes, its fields (name -> value) and its buttons' labels."""

    action: str
    method: str
    fields: dict[str, str] = field(default_factory=dict)
    inputs: dict[str, str] = field(default_factory=dict)
    """Field name -> element kind (``input:text``, ``select``, ``textarea`` …)."""
    buttons: list[str] = field(default_factory=list)
    options: dict[str, list[str]] = field(default_factory=dict)


class Page(HTMLParser):
    """A parsed page: ``links`` (href, text), ``forms``, and all text."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []
        self.forms: list[Form] = []
        self.text: list[str] = []
        self._href: str | None = None
        self._link_text: list[str] = []
        self._form: Form | None = None
        self._select: str | None = None
        self._button: list[str] | None = None
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "a" and "href" in a:
            self._href, self._link_text = a["href"], []
        elif tag == "form":
            self._form = Form(a.get("action", ""), a.get("method", "get").lower())
            self.forms.append(self._form)
        elif self._form is not None and tag == "input" and "name" in a:
            self._form.fields[a["name"]] = a.get("value", "")
            self._form.inputs[a["name"]] = f"input:{a.get('type', 'text')}"
        elif self._form is not None and tag in ("select", "textarea") and "name" in a:
            self._form.fields[a["name"]] = ""
            self._form.inputs[a["name"]] = tag
            self._select = a["name"] if tag == "select" else None
            if tag == "select":
                self._form.options[a["name"]] = []
        elif self._form is not None and tag == "option" and self._select is not None:
            self._form.options[self._select].append(a.get("value", ""))
            if "selected" in a:
                self._form.fields[self._select] = a.get("value", "")
        elif tag == "button":
            self._button = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._href is not None:
            self.links.append((self._href, "".join(self._link_text).strip()))
            self._href = None
        elif tag == "form":
            self._form = None
        elif tag == "select":
            self._select = None
        elif tag == "button" and self._button is not None:
            if self._form is not None:
                self._form.buttons.append("".join(self._button).strip())
            self._button = None

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._href is not None:
            self._link_text.append(data)
        if self._button is not None:
            self._button.append(data)

    @property
    def all_text(self) -> str:
        return " ".join(" ".join(self.text).split())

    def form_with(self, button: str) -> Form:
        """The one form with a button labelled ``button``."""
        found = [f for f in self.forms if button in f.buttons]
        assert len(found) == 1, [f.buttons for f in self.forms]
        return found[0]
