"""Per-language lexicons and word order: claims -> sentences in en, de, fr, es, ja.

Each language is one small class with the same methods (``np`` for noun phrases,
``unit`` for whole sentences); ``style`` picks among alternative templates, which
is how paraphrases are made. Morphology is handled where the grammar needs it:
German adjective declension (gender x article x case), French/Spanish gender and
number agreement and article contraction (du, d'un, del, al), Japanese counters
and no spaces between words.
"""
from __future__ import annotations

from capscore.errors import CapscoreError, unknown_name
from capscore.scenes.claims import Mention, Unit

N_STYLES = 3  # every language offers styles 0..N_STYLES-1 for each form
# Every lexicon spells the numbers 1..MAX_NUMBER. Scenes hold at most six objects, but flawed and
# graded captions may state one more (a hallucinated object, a count or total off by one or two).
MAX_NUMBER = 12


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


def _join(items: list[str], sep: str, last: str) -> str:
    if len(items) == 1:
        return items[0]
    return sep.join(items[:-1]) + last + items[-1]


# ==================================================================================== English
class English:
    code = "en"
    shapes = {"circle": ("circle", "circles"), "square": ("square", "squares"), "triangle": ("triangle", "triangles"),
              "diamond": ("diamond", "diamonds"), "star": ("star", "stars"), "cross": ("cross", "crosses")}
    colors = {c: c for c in ("red", "green", "blue", "yellow", "purple", "orange", "pink", "white")}
    sizes = {"small": "small", "large": "large"}
    patterns = {"striped": "striped", "dotted": "dotted"}
    numbers = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine",
               10: "ten", 11: "eleven", 12: "twelve"}
    relations = {"left of": "to the left of", "right of": "to the right of", "above": "above", "below": "below",
                 "next to": "next to"}
    regions = {"top left": "in the top left corner", "top": "at the top", "top right": "in the top right corner",
               "left": "on the left", "center": "in the center", "right": "on the right",
               "bottom left": "in the bottom left corner", "bottom": "at the bottom",
               "bottom right": "in the bottom right corner"}
    motions = {"left": "left", "right": "right", "up": "up", "down": "down"}

    def np(self, m: Mention, *, definite: bool = False) -> str:
        words = [w for w in (self.sizes.get(m.size), self.colors[m.color], self.patterns.get(m.pattern)) if w]
        noun = self.shapes[m.shape][m.count > 1]
        core = " ".join(words + [noun])
        if definite:
            return f"the {self.numbers[m.count]} {core}" if m.count > 1 else f"the {core}"
        if m.count > 1:
            return f"{self.numbers[m.count]} {core}"
        return ("an " if core[0] in "aeiou" else "a ") + core

    def unit(self, u: Unit, style: int = 0) -> str:
        f, c = u.form, u.claims
        if f == "picture":
            items = _join([self.np(m) for m in c], ", ", " and ")
            return [f"A picture of {items}.", f"An image showing {items}.", f"{_cap(items)} on a grey background."][style]
        if f == "relphrase":
            r = c[0]
            text = f"{self.np(r.a)} {self.relations[r.rel]} {self.np(r.b)}"
            return [_cap(text) + ".", f"A picture of {text}.", f"An image with {text}."][style]
        if f == "total":
            n = c[0].n
            obj = "one object" if n == 1 else f"{self.numbers[n]} objects"
            return [f"The image shows {obj}.", f"There {'is' if n == 1 else 'are'} {obj} in total.",
                    f"The picture contains {obj}."][style]
        if f == "exists":
            m = c[0]
            verb = "are" if m.count > 1 else "is"
            return [f"There {verb} {self.np(m)}.", f"The image contains {self.np(m)}.",
                    f"We can see {self.np(m)}."][style]
        if f == "relation":
            r = c[0]
            a, b = self.np(r.a, definite=True), self.np(r.b, definite=True)
            return [f"{_cap(a)} is {self.relations[r.rel]} {b}.", f"{_cap(a)} appears {self.relations[r.rel]} {b}.",
                    f"{_cap(a)} sits {self.relations[r.rel]} {b}."][style]
        if f == "where":
            w = c[0]
            a = self.np(w.m, definite=True)
            return [f"{_cap(a)} is {self.regions[w.region]}.", f"{_cap(a)} appears {self.regions[w.region]}.",
                    f"{_cap(a)} sits {self.regions[w.region]}."][style]
        if f == "motion":
            parts = [f"{self.np(x.m, definite=True)} {'move' if x.m.count > 1 else 'moves'} {self.motions[x.direction]}"
                     for x in c]
            text = _join(parts, ", ", " and ")
            return [_cap(text) + ".", f"In this clip {text}.", f"A short video: {text}."][style]
        raise ValueError(f)


# ==================================================================================== German
class German:
    code = "de"
    # noun: (singular, plural, gender)
    shapes = {"circle": ("Kreis", "Kreise", "m"), "square": ("Quadrat", "Quadrate", "n"),
              "triangle": ("Dreieck", "Dreiecke", "n"), "diamond": ("Raute", "Rauten", "f"),
              "star": ("Stern", "Sterne", "m"), "cross": ("Kreuz", "Kreuze", "n")}
    colors = {"red": "rot", "green": "grün", "blue": "blau", "yellow": "gelb", "purple": "violett",
              "orange": "orangefarben", "pink": "rosafarben", "white": "weiß"}
    sizes = {"small": "klein", "large": "groß"}
    patterns = {"striped": "gestreift", "dotted": "gepunktet"}
    numbers = {1: "ein", 2: "zwei", 3: "drei", 4: "vier", 5: "fünf", 6: "sechs", 7: "sieben", 8: "acht", 9: "neun",
               10: "zehn", 11: "elf", 12: "zwölf"}
    relations = {"left of": "links von", "right of": "rechts von", "above": "über", "below": "unter",
                 "next to": "neben"}
    regions = {"top left": "oben links", "top": "oben", "top right": "oben rechts", "left": "links",
               "center": "in der Mitte", "right": "rechts", "bottom left": "unten links", "bottom": "unten",
               "bottom right": "unten rechts"}
    motions = {"left": "nach links", "right": "nach rechts", "up": "nach oben", "down": "nach unten"}

    def np(self, m: Mention, *, definite: bool = False, dative: bool = False) -> str:
        sg, pl, g = self.shapes[m.shape]
        stems = [w for w in (self.sizes.get(m.size), self.colors[m.color], self.patterns.get(m.pattern)) if w]
        plural = m.count > 1
        if plural:
            end = "en" if (definite or dative) else "e"
            noun = pl + ("n" if dative and not pl.endswith("n") else "")
            art = ({"m": "den", "f": "den", "n": "den"} if dative else {"m": "die", "f": "die", "n": "die"})[g] if definite else ""
            head = f"{art} {self.numbers[m.count]}".strip()
        else:
            noun = sg
            if definite:
                art = ("dem" if g != "f" else "der") if dative else {"m": "der", "f": "die", "n": "das"}[g]
                end = "en" if dative else "e"
            else:
                art = ("einem" if g != "f" else "einer") if dative else {"m": "ein", "f": "eine", "n": "ein"}[g]
                end = "en" if dative else {"m": "er", "f": "e", "n": "es"}[g]
            head = art
        adjs = [s + end for s in stems]
        return " ".join([head] + adjs + [noun])

    def _rel(self, rel: str, b: Mention, definite: bool) -> str:
        phrase = f"{self.relations[rel]} {self.np(b, definite=definite, dative=True)}"
        return phrase.replace("von dem ", "vom ")

    def unit(self, u: Unit, style: int = 0) -> str:
        f, c = u.form, u.claims
        if f == "picture":
            items = _join([self.np(m) for m in c], ", ", " und ")
            verb = "sind" if len(c) > 1 or c[0].count > 1 else "ist"
            return [f"Zu sehen {verb} {items}.", f"Im Bild {verb} {items}.", f"{_cap(items)} auf grauem Hintergrund."][style]
        if f == "relphrase":
            r = c[0]
            text = f"{self.np(r.a)} {self._rel(r.rel, r.b, False)}"
            verb = "sind" if r.a.count > 1 else "ist"
            return [_cap(text) + ".", f"Zu sehen {verb} {text}.", f"Ein Bild: {text}."][style]
        if f == "total":
            n = c[0].n
            obj = "ein Objekt" if n == 1 else f"{self.numbers[n]} Objekte"
            return [f"Das Bild zeigt {obj}.", f"Insgesamt {'ist' if n == 1 else 'sind'} {obj} zu sehen.",
                    f"Auf dem Bild {'ist' if n == 1 else 'sind'} {obj}."][style]
        if f == "exists":
            m = c[0]
            verb = "sind" if m.count > 1 else "ist"
            return [f"Im Bild {verb} {self.np(m)}.", f"Zu sehen {verb} {self.np(m)}.",
                    f"Es {verb} {self.np(m)} vorhanden."][style]
        if f == "relation":
            r = c[0]
            a = _cap(self.np(r.a, definite=True))
            verb = "sind" if r.a.count > 1 else "ist"
            rel = self._rel(r.rel, r.b, True)
            return [f"{a} {verb} {rel}.", f"{a} befindet sich {rel}.", f"{a} liegt {rel}."][style]
        if f == "where":
            w = c[0]
            a = _cap(self.np(w.m, definite=True))
            return [f"{a} ist {self.regions[w.region]}.", f"{a} befindet sich {self.regions[w.region]}.",
                    f"{a} liegt {self.regions[w.region]}."][style]
        if f == "motion":
            parts = [f"{self.np(x.m, definite=True)} {'bewegen' if x.m.count > 1 else 'bewegt'} sich "
                     f"{self.motions[x.direction]}" for x in c]
            text = _join(parts, ", ", " und ")
            return [_cap(text) + ".", f"In diesem Clip gilt: {text}.", f"Ein kurzes Video: {text}."][style]
        raise ValueError(f)


# ==================================================================================== French
class French:
    code = "fr"
    shapes = {"circle": ("cercle", "cercles", "m"), "square": ("carré", "carrés", "m"),
              "triangle": ("triangle", "triangles", "m"), "diamond": ("losange", "losanges", "m"),
              "star": ("étoile", "étoiles", "f"), "cross": ("croix", "croix", "f")}
    # adjective: (masc sg, fem sg, masc pl, fem pl)
    colors = {"red": ("rouge", "rouge", "rouges", "rouges"), "green": ("vert", "verte", "verts", "vertes"),
              "blue": ("bleu", "bleue", "bleus", "bleues"), "yellow": ("jaune", "jaune", "jaunes", "jaunes"),
              "purple": ("violet", "violette", "violets", "violettes"),
              "orange": ("orange", "orange", "orange", "orange"), "pink": ("rose", "rose", "roses", "roses"),
              "white": ("blanc", "blanche", "blancs", "blanches")}
    sizes = {"small": ("petit", "petite", "petits", "petites"), "large": ("grand", "grande", "grands", "grandes")}
    patterns = {"striped": ("rayé", "rayée", "rayés", "rayées"), "dotted": ("à pois",) * 4}
    numbers = {1: "un", 2: "deux", 3: "trois", 4: "quatre", 5: "cinq", 6: "six", 7: "sept", 8: "huit", 9: "neuf",
               10: "dix", 11: "onze", 12: "douze"}
    relations = {"left of": "à gauche de", "right of": "à droite de", "above": "au-dessus de",
                 "below": "en dessous de", "next to": "à côté de"}
    regions = {"top left": "en haut à gauche", "top": "en haut", "top right": "en haut à droite",
               "left": "à gauche", "center": "au centre", "right": "à droite", "bottom left": "en bas à gauche",
               "bottom": "en bas", "bottom right": "en bas à droite"}
    motions = {"left": "vers la gauche", "right": "vers la droite", "up": "vers le haut", "down": "vers le bas"}

    def np(self, m: Mention, *, definite: bool = False) -> str:
        sg, pl, g = self.shapes[m.shape]
        k = (g == "f") + 2 * (m.count > 1)
        size = self.sizes[m.size][k] if m.size else None
        after = [self.colors[m.color][k]] + ([self.patterns[m.pattern][k]] if m.pattern else [])
        body = " ".join(([size] if size else []) + [pl if m.count > 1 else sg] + after)
        if m.count > 1:
            return f"les {self.numbers[m.count]} {body}" if definite else f"{self.numbers[m.count]} {body}"
        if definite:
            return ("l'" + body) if body[0] in "aeiouéè" else ("la " if g == "f" else "le ") + body
        return ("une " if g == "f" else "un ") + body

    @staticmethod
    def _de(np: str) -> str:
        """de + noun phrase with contraction (du, des, d'un, de la, de l')."""
        if np.startswith("le "):
            return "du " + np[3:]
        if np.startswith("les "):
            return "des " + np[4:]
        if np.startswith(("un ", "une ")):
            return "d'" + np
        return "de " + np

    def _rel(self, rel: str, b: Mention, definite: bool) -> str:
        base = self.relations[rel].removesuffix(" de")  # every French relation ends in "de"
        return f"{base} {self._de(self.np(b, definite=definite))}"

    def unit(self, u: Unit, style: int = 0) -> str:
        f, c = u.form, u.claims
        if f == "picture":
            items = _join([self.np(m) for m in c], ", ", " et ")
            return [f"Une image avec {items}.", f"Une image montrant {items}.", f"{_cap(items)} sur fond gris."][style]
        if f == "relphrase":
            r = c[0]
            text = f"{self.np(r.a)} {self._rel(r.rel, r.b, False)}"
            return [_cap(text) + ".", f"Une image avec {text}.", f"On voit {text}."][style]
        if f == "total":
            n = c[0].n
            obj = "un objet" if n == 1 else f"{self.numbers[n]} objets"
            return [f"L'image montre {obj}.", f"Il y a {obj} au total.", f"L'image contient {obj}."][style]
        if f == "exists":
            m = c[0]
            return [f"Il y a {self.np(m)}.", f"L'image contient {self.np(m)}.", f"On voit {self.np(m)}."][style]
        if f == "relation":
            r = c[0]
            a = _cap(self.np(r.a, definite=True))
            verb = "sont" if r.a.count > 1 else "est"
            rel = self._rel(r.rel, r.b, True)
            return [f"{a} {verb} {rel}.", f"{a} se trouve {rel}." if r.a.count == 1 else f"{a} se trouvent {rel}.",
                    f"{a} apparaît {rel}." if r.a.count == 1 else f"{a} apparaissent {rel}."][style]
        if f == "where":
            w = c[0]
            a = _cap(self.np(w.m, definite=True))
            pl = w.m.count > 1
            return [f"{a} {'sont' if pl else 'est'} {self.regions[w.region]}.",
                    f"{a} {'se trouvent' if pl else 'se trouve'} {self.regions[w.region]}.",
                    f"{a} {'apparaissent' if pl else 'apparaît'} {self.regions[w.region]}."][style]
        if f == "motion":
            parts = [f"{self.np(x.m, definite=True)} {'se déplacent' if x.m.count > 1 else 'se déplace'} "
                     f"{self.motions[x.direction]}" for x in c]
            text = _join(parts, ", ", " et ")
            return [_cap(text) + ".", f"Dans cette vidéo, {text}.", f"Une courte vidéo : {text}."][style]
        raise ValueError(f)


# ==================================================================================== Spanish
class Spanish:
    code = "es"
    shapes = {"circle": ("círculo", "círculos", "m"), "square": ("cuadrado", "cuadrados", "m"),
              "triangle": ("triángulo", "triángulos", "m"), "diamond": ("rombo", "rombos", "m"),
              "star": ("estrella", "estrellas", "f"), "cross": ("cruz", "cruces", "f")}
    colors = {"red": ("rojo", "roja", "rojos", "rojas"), "green": ("verde", "verde", "verdes", "verdes"),
              "blue": ("azul", "azul", "azules", "azules"),
              "yellow": ("amarillo", "amarilla", "amarillos", "amarillas"),
              "purple": ("morado", "morada", "morados", "moradas"),
              "orange": ("naranja", "naranja", "naranja", "naranja"), "pink": ("rosa", "rosa", "rosa", "rosa"),
              "white": ("blanco", "blanca", "blancos", "blancas")}
    sizes = {"small": ("pequeño", "pequeña", "pequeños", "pequeñas"),
             "large": ("grande", "grande", "grandes", "grandes")}
    patterns = {"striped": ("rayado", "rayada", "rayados", "rayadas"), "dotted": ("de lunares",) * 4}
    numbers = {1: "un", 2: "dos", 3: "tres", 4: "cuatro", 5: "cinco", 6: "seis", 7: "siete", 8: "ocho", 9: "nueve",
               10: "diez", 11: "once", 12: "doce"}
    relations = {"left of": "a la izquierda de", "right of": "a la derecha de", "above": "encima de",
                 "below": "debajo de", "next to": "junto a"}
    regions = {"top left": "arriba a la izquierda", "top": "arriba", "top right": "arriba a la derecha",
               "left": "a la izquierda", "center": "en el centro", "right": "a la derecha",
               "bottom left": "abajo a la izquierda", "bottom": "abajo", "bottom right": "abajo a la derecha"}
    motions = {"left": "hacia la izquierda", "right": "hacia la derecha", "up": "hacia arriba", "down": "hacia abajo"}

    def np(self, m: Mention, *, definite: bool = False) -> str:
        sg, pl, g = self.shapes[m.shape]
        k = (g == "f") + 2 * (m.count > 1)
        words = [pl if m.count > 1 else sg, self.colors[m.color][k]]
        if m.size:
            words.append(self.sizes[m.size][k])
        if m.pattern:
            words.append(self.patterns[m.pattern][k])
        body = " ".join(words)
        if m.count > 1:
            art = ("las " if g == "f" else "los ") if definite else ""
            return f"{art}{self.numbers[m.count]} {body}"
        if definite:
            return ("la " if g == "f" else "el ") + body
        return ("una " if g == "f" else "un ") + body

    def _rel(self, rel: str, b: Mention, definite: bool) -> str:
        phrase = f"{self.relations[rel]} {self.np(b, definite=definite)}"
        return phrase.replace(" de el ", " del ").replace(" a el ", " al ")

    def unit(self, u: Unit, style: int = 0) -> str:
        f, c = u.form, u.claims
        if f == "picture":
            items = _join([self.np(m) for m in c], ", ", " y ")
            return [f"Una imagen con {items}.", f"Una imagen que muestra {items}.", f"{_cap(items)} sobre fondo gris."][style]
        if f == "relphrase":
            r = c[0]
            text = f"{self.np(r.a)} {self._rel(r.rel, r.b, False)}"
            return [_cap(text) + ".", f"Una imagen con {text}.", f"Se ve {text}."][style]
        if f == "total":
            n = c[0].n
            obj = "un objeto" if n == 1 else f"{self.numbers[n]} objetos"
            return [f"La imagen muestra {obj}.", f"Hay {obj} en total.", f"La imagen contiene {obj}."][style]
        if f == "exists":
            m = c[0]
            return [f"Hay {self.np(m)}.", f"La imagen contiene {self.np(m)}.",
                    f"{'Se ven' if m.count > 1 else 'Se ve'} {self.np(m)}."][style]
        if f == "relation":
            r = c[0]
            a = _cap(self.np(r.a, definite=True))
            pl = r.a.count > 1
            rel = self._rel(r.rel, r.b, True)
            return [f"{a} {'están' if pl else 'está'} {rel}.", f"{a} {'se encuentran' if pl else 'se encuentra'} {rel}.",
                    f"{a} {'aparecen' if pl else 'aparece'} {rel}."][style]
        if f == "where":
            w = c[0]
            a = _cap(self.np(w.m, definite=True))
            pl = w.m.count > 1
            return [f"{a} {'están' if pl else 'está'} {self.regions[w.region]}.",
                    f"{a} {'se encuentran' if pl else 'se encuentra'} {self.regions[w.region]}.",
                    f"{a} {'aparecen' if pl else 'aparece'} {self.regions[w.region]}."][style]
        if f == "motion":
            parts = [f"{self.np(x.m, definite=True)} {'se mueven' if x.m.count > 1 else 'se mueve'} "
                     f"{self.motions[x.direction]}" for x in c]
            text = _join(parts, ", ", " y ")
            return [_cap(text) + ".", f"En este vídeo, {text}.", f"Un vídeo corto: {text}."][style]
        raise ValueError(f)


# ==================================================================================== Japanese
class Japanese:
    code = "ja"
    shapes = {"circle": "円", "square": "四角形", "triangle": "三角形", "diamond": "ひし形", "star": "星",
              "cross": "十字"}
    colors = {"red": "赤い", "green": "緑の", "blue": "青い", "yellow": "黄色い", "purple": "紫の",
              "orange": "オレンジ色の", "pink": "ピンク色の", "white": "白い"}
    sizes = {"small": "小さな", "large": "大きな"}
    patterns = {"striped": "縞模様の", "dotted": "水玉模様の"}
    # native counter -tsu up to nine, 十 (tō) for ten, the general counter 個 above
    numbers = {1: "一つ", 2: "二つ", 3: "三つ", 4: "四つ", 5: "五つ", 6: "六つ", 7: "七つ", 8: "八つ", 9: "九つ",
               10: "十", 11: "十一個", 12: "十二個"}
    relations = {"left of": "左", "right of": "右", "above": "上", "below": "下", "next to": "隣"}
    regions = {"top left": "左上", "top": "上", "top right": "右上", "left": "左", "center": "中央", "right": "右",
               "bottom left": "左下", "bottom": "下", "bottom right": "右下"}
    motions = {"left": "左", "right": "右", "up": "上", "down": "下"}

    def np(self, m: Mention, *, definite: bool = False) -> str:
        core = "".join(w for w in (self.sizes.get(m.size), self.colors[m.color], self.patterns.get(m.pattern),
                                   self.shapes[m.shape]) if w)
        return f"{self.numbers[m.count]}の{core}" if m.count > 1 else core

    def unit(self, u: Unit, style: int = 0) -> str:
        f, c = u.form, u.claims
        if f == "picture":
            items = "と".join(self.np(m) for m in c)
            return [f"{items}の画像。", f"{items}が写っている画像。", f"灰色の背景に{items}。"][style]
        if f == "relphrase":
            r = c[0]
            text = f"{self.np(r.b)}の{self.relations[r.rel]}にある{self.np(r.a)}"
            return [f"{text}。", f"{text}の画像。", f"{text}が見える。"][style]
        if f == "total":
            n = c[0].n
            return [f"画像には{self.numbers[n]}の物体がある。", f"全部で{self.numbers[n]}の物体がある。",
                    f"物体は{self.numbers[n]}ある。"][style]
        if f == "exists":
            m = c[0]
            bare = self.np(Mention(m.shape, m.color, 1, m.size, m.pattern))
            return [f"{bare}が{self.numbers[m.count]}ある。", f"画像には{bare}が{self.numbers[m.count]}ある。",
                    f"{bare}が{self.numbers[m.count]}見える。"][style]
        if f == "relation":
            r = c[0]
            rel = f"{self.np(r.b)}の{self.relations[r.rel]}"
            return [f"{self.np(r.a)}は{rel}にある。", f"{self.np(r.a)}は{rel}に位置している。",
                    f"{rel}に{self.np(r.a)}がある。"][style]
        if f == "where":
            w = c[0]
            reg = self.regions[w.region]
            return [f"{self.np(w.m)}は{reg}にある。", f"{self.np(w.m)}は{reg}に位置している。",
                    f"{reg}に{self.np(w.m)}がある。"][style]
        if f == "motion":
            text = "、".join(f"{self.np(x.m)}は{self.motions[x.direction]}へ" for x in c) + "動く"
            return [f"{text}。", f"この動画では{text}。", f"短い動画：{text}。"][style]
        raise ValueError(f)


LANGUAGES: dict[str, object] = {cls.code: cls() for cls in (English, German, French, Spanish, Japanese)}
SEPARATOR = {"en": " ", "de": " ", "fr": " ", "es": " ", "ja": ""}


def get_language(lang: str):
    if lang not in LANGUAGES:
        raise unknown_name("language", lang, LANGUAGES)
    return LANGUAGES[lang]


def _numbers(unit: Unit) -> list[int]:
    out = []
    for c in unit.claims:
        for m in (getattr(c, "a", None), getattr(c, "b", None), getattr(c, "m", None), c):
            if isinstance(m, Mention):
                out.append(m.count)
        if hasattr(c, "n"):
            out.append(c.n)
    return out


def realise(unit: Unit, lang: str = "en", style: int = 0) -> str:
    bad = [n for n in _numbers(unit) if not 1 <= n <= MAX_NUMBER]
    if bad:
        raise CapscoreError(f"scene captions spell numbers 1..{MAX_NUMBER}; got {bad[0]} in a {unit.form!r} unit")
    return get_language(lang).unit(unit, style % N_STYLES)
