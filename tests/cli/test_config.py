from pathlib import Path

import pytest

from reef.config import ConfigError, load_config


def test_defaults_without_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = load_config(env={})
    assert config.server.port == 8900
    assert config.server.host == "127.0.0.1"
    assert config.engine.kind == "auto"
    assert config.experience_db == Path(".reef/experience.db")


def test_reads_reef_yaml_in_the_working_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "reef.yaml").write_text("server:\n  port: 9100\n")
    monkeypatch.chdir(tmp_path)
    assert load_config(env={}).server.port == 9100


def test_interpolates_environment_variables(tmp_path: Path) -> None:
    path = tmp_path / "reef.yaml"
    path.write_text(
        "engine:\n  kind: upstream\n  upstream:\n"
        "    url: ${UP_URL}\n    model: ${UP_MODEL:-fallback}\n"
    )
    config = load_config(path, env={"UP_URL": "http://127.0.0.1:9/v1"})
    assert config.engine.upstream.url == "http://127.0.0.1:9/v1"
    assert config.engine.upstream.model == "fallback"


def test_missing_variable_names_the_key(tmp_path: Path) -> None:
    path = tmp_path / "reef.yaml"
    path.write_text("engine:\n  upstream:\n    url: ${NOT_SET_ANYWHERE}\n")
    with pytest.raises(
        ConfigError, match=r"engine\.upstream\.url: environment variable NOT_SET_ANYWHERE"
    ):
        load_config(path, env={})


def test_unknown_key_names_its_path(tmp_path: Path) -> None:
    path = tmp_path / "reef.yaml"
    path.write_text("server:\n  prot: 9000\n")
    with pytest.raises(ConfigError, match=r"server\.prot: unknown key"):
        load_config(path, env={})


def test_a_key_set_twice_names_the_file_the_line_and_the_dotted_key(tmp_path: Path) -> None:
    path = tmp_path / "reef.yaml"
    path.write_text("gate:\n  seed: 0\n  temperature: 0.0\n  temperature: 0.7\n")
    with pytest.raises(
        ConfigError, match=r"reef\.yaml line 4: gate\.temperature is set twice \(first at line 3\)"
    ):
        load_config(path, env={})


def test_the_same_key_in_two_mappings_is_no_duplicate(tmp_path: Path) -> None:
    path = tmp_path / "reef.yaml"
    path.write_text("gate:\n  seed: 3\nlearning:\n  seed: 4\n")
    assert load_config(path, env={}).gate.seed == 3


def test_wrong_type_names_the_key_and_the_value(tmp_path: Path) -> None:
    path = tmp_path / "reef.yaml"
    path.write_text("server:\n  port: lots\n")
    with pytest.raises(ConfigError, match=r"server\.port: .*'lots'"):
        load_config(path, env={})


def test_flags_override_the_file(tmp_path: Path) -> None:
    path = tmp_path / "reef.yaml"
    path.write_text("server:\n  port: 9100\nengine:\n  kind: llamacpp\n")
    config = load_config(path, {"server.port": 9200, "engine.kind": None}, env={})
    assert config.server.port == 9200
    assert config.engine.kind == "llamacpp"


def test_tokens_from_environment_add_to_the_file(tmp_path: Path) -> None:
    path = tmp_path / "reef.yaml"
    path.write_text("server:\n  tokens: [from-file]\n")
    config = load_config(path, env={"REEF_TOKEN": "a, b"})
    assert config.token_values() == ["from-file", "a", "b"]
    assert "from-file" not in str(config.redacted())


def test_upstream_environment_variables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    env = {"REEF_UPSTREAM_URL": "http://127.0.0.1:7/v1", "REEF_UPSTREAM_API_KEY": "sk-up"}
    config = load_config(None, env=env)
    assert config.engine.upstream.url == "http://127.0.0.1:7/v1"
    assert config.engine.upstream.api_key is not None
    assert config.engine.upstream.api_key.get_secret_value() == "sk-up"
    assert "sk-up" not in str(config.redacted())


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / "reef.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(path, env={})


def test_missing_file_says_how_to_create_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="reef init"):
        load_config(tmp_path / "nope.yaml", env={})


def test_relative_dirs_in_a_config_file_resolve_against_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "reef.yaml").write_text("state_dir: state\nevals_dir: my-evals\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    config = load_config(Path("../project/reef.yaml"), env={})
    assert config.state_dir.resolve() == project / "state"
    assert config.evals_dir.resolve() == project / "my-evals"
    assert config.experience_db.resolve() == project / "state/experience.db"


def test_defaults_follow_the_config_file_and_stay_relative_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "project").mkdir()
    (tmp_path / "project/reef.yaml").write_text("server:\n  port: 9100\n")
    config = load_config(tmp_path / "project/reef.yaml", env={})
    assert config.state_dir == tmp_path / "project/.reef"
    assert config.evals_dir == tmp_path / "project/evals"
    monkeypatch.chdir(tmp_path / "project")
    beside = load_config(Path("reef.yaml"), env={})
    assert beside.state_dir == Path(".reef") and beside.evals_dir == Path("evals")


def test_absolute_and_home_dirs_in_a_config_file_are_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    path = tmp_path / "project/reef.yaml"
    path.parent.mkdir()
    path.write_text(f"state_dir: ~/reef-state\nevals_dir: {tmp_path}/shared-evals\n")
    config = load_config(path, env={})
    assert config.state_dir == tmp_path / "home/reef-state"
    assert config.evals_dir == tmp_path / "shared-evals"


def test_retention_has_defaults_and_refuses_negative_counts(tmp_path: Path) -> None:
    path = tmp_path / "reef.yaml"
    path.write_text("retention:\n  checkouts: 3\n")
    config = load_config(path, env={})
    assert (config.retention.candidates, config.retention.checkouts) == (50, 3)
    path.write_text("retention:\n  candidates: -1\n")
    with pytest.raises(ConfigError, match=r"retention\.candidates"):
        load_config(path, env={})


def test_a_recipe_file_is_found_relative_to_the_config_file(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "reef.yaml").write_text("learning:\n  recipe: recipes/mine.py:Mine\n")
    config = load_config(project / "reef.yaml", env={})
    assert config.learning.recipe == f"{project / 'recipes/mine.py'}:Mine"
    (project / "reef.yaml").write_text("learning:\n  recipe: harness_evolve\n")
    assert load_config(project / "reef.yaml", env={}).learning.recipe == "harness_evolve"


def test_the_store_is_a_path_beside_the_config_or_a_postgresql_url(tmp_path: Path) -> None:
    (tmp_path / "reef.yaml").write_text("store:\n  url: data/experience.db\n")
    assert load_config(tmp_path / "reef.yaml", env={}).experience_store == (
        tmp_path / "data/experience.db"
    )
    url = "postgresql://reef@db.internal/reef"
    env = {"REEF_STORE_URL": url, "REEF_RELEASES_REMOTE": "ssh://git@git.internal/r.git"}
    config = load_config(tmp_path / "reef.yaml", env=env)
    assert config.experience_store == url
    assert config.releases.remote == "ssh://git@git.internal/r.git"


def test_passwords_in_the_store_and_remote_urls_never_show(tmp_path: Path) -> None:
    (tmp_path / "reef.yaml").write_text(
        "store:\n  url: postgresql://reef:s3cret@db/reef\n"
        "releases:\n  remote: https://ci-token-42@git.example.com/releases.git\n"
    )
    shown = load_config(tmp_path / "reef.yaml", env={}).redacted()
    assert shown["store"]["url"] == "postgresql://reef:***@db/reef"
    assert shown["releases"]["remote"] == "https://***@git.example.com/releases.git"
    (tmp_path / "reef.yaml").write_text("store:\n  url: postgresql+psycopg://reef:s3cret@db/x\n")
    with pytest.raises(ConfigError, match="neither a SQLite file's path") as refused:
        load_config(tmp_path / "reef.yaml", env={})
    assert "s3cret" not in str(refused.value)


def test_a_misspelt_key_says_which_key_it_may_be(tmp_path: Path) -> None:
    (tmp_path / "reef.yaml").write_text(
        "gate:\n  polcy: review\nengine:\n  llamacpp:\n    n_tread: 2\nsevrer: {}\nzzz: 1\n"
    )
    with pytest.raises(ConfigError) as refused:
        load_config(tmp_path / "reef.yaml", env={})
    said = str(refused.value)
    assert "gate.polcy: unknown key (did you mean policy?)" in said
    assert "engine.llamacpp.n_tread: unknown key (did you mean n_threads?)" in said
    assert "sevrer: unknown key (did you mean server?)" in said
    assert "zzz: unknown key\n" in said + "\n"  # nothing near: no guess
